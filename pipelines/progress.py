"""Stage progress: one listener protocol for every way a stage is run.

The steps (:mod:`pipelines.steps`) translate the stages' callbacks (finished shards, training
metrics) into :class:`Listener` calls. The CLI's live display implements it for single verbs
and for ``robo-pipe run``; the flow's Prefect tasks send their progress to whatever listens in
their process (:func:`listening`), which is how ``robo-pipe run`` shows the flow live.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol


class Listener(Protocol):
    """Receives a stage's progress. ``stage`` is a stage name (``collect``, ``pretrain``,
    ``finetune``, ``export``, ``evaluate``, ``latency``, ``register``)."""

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """``stage`` began: ``total`` units of work (None: unknown), e.g. 2000 episodes."""

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """``completed`` units done (0: only ``detail`` changed); ``detail`` is one short
        status, e.g. ``"loss 0.0123, 850 samples/s"``."""

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """``stage`` completed; ``detail`` describes its record (:func:`describe`);
        ``reused``: the record came from an earlier run. A display times a stage from its
        first event: one reported only as it ends (a reused stage, a device's step, whose
        ``detail`` carries the duration the device measured) has no duration of the
        display's."""

    def said(self, stage: str, line: str) -> None:
        """A line worth keeping in the output, not only as the live status: e.g. ``waiting
        for run <run> (pid N) to finish collect of <path>``, or taking over a dead run's."""


class Silent:
    """A listener that drops everything (a step called without one)."""

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """Ignored."""

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """Ignored."""

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """Ignored."""

    def said(self, stage: str, line: str) -> None:
        """Ignored."""


SILENT = Silent()


class Broadcast:
    """A listener that forwards to every listener registered with :func:`listening` (none:
    progress goes nowhere). The Prefect tasks report to this one."""

    def __init__(self) -> None:
        self.listeners: list[Listener] = []

    def started(self, stage: str, total: float | None, unit: str) -> None:
        for listener in self.listeners:
            listener.started(stage, total, unit)

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        for listener in self.listeners:
            listener.advanced(stage, completed, detail)

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        for listener in self.listeners:
            listener.finished(stage, detail, reused)

    def said(self, stage: str, line: str) -> None:
        """Forwarded, and printed: inside a Prefect task (``log_prints``) the line goes to the
        flow run's log, so a served run that waited for another says so there too."""
        print(f"{stage}: {line}")
        for listener in self.listeners:
            listener.said(stage, line)


BROADCAST = Broadcast()
"""This process's listeners (see :func:`listening`)."""


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Send the progress of stages run in this process to ``listener`` inside the block."""
    BROADCAST.listeners.append(listener)
    try:
        yield
    finally:
        BROADCAST.listeners.remove(listener)


# -- one line per record and per metrics record (the display's "detail" column) ----------------


def training_detail(metrics: dict[str, float]) -> str:
    """A BC metrics record (``stages.finetune``): loss and throughput."""
    return f"loss {metrics['action_loss']:.4f}, {metrics['samples_per_s']:,.0f} samples/s"


def rl_detail(algo: str, metrics: dict[str, float]) -> str:
    """An RL iteration's metrics record: its number, training-episode success and
    env-steps/s."""
    success = metrics.get("success_rate", math.nan)
    shown = "-" if math.isnan(success) else f"{success:.0%}"
    return (
        f"{algo} iteration {metrics['step']:.0f}: training success {shown}, "
        f"{metrics['env_steps_per_s']:,.0f} env-steps/s"
    )


def describe(stage: str, record: Any) -> str:
    """One line describing a stage's record, for the display."""
    if stage == "collect":
        return f"{record.episodes} episodes, {record.frames} frames"
    if stage in ("pretrain", "finetune"):
        metrics = record.metrics
        if "action_loss" in metrics:  # behaviour cloning
            return f"step {record.step}, loss {metrics['action_loss']:.4f}"
        success = metrics.get("success_rate", math.nan)  # RL: no action loss
        shown = "-" if math.isnan(success) else f"{success:.0%}"
        return f"iteration {record.step}, training success {shown}"
    if stage == "export":
        return f"parity {record.parity_max_abs_error:.1e}"
    if stage == "evaluate":
        report = getattr(record, "candidate", record)  # the pipeline's Evaluation, or a report
        low, high = report.ci95
        return f"success {report.success_rate:.1%} ({low:.1%} - {high:.1%})"
    if stage == "latency":
        return f"p99 {record.p99_ms:.2f} ms ({'pass' if record.passed else 'FAIL'})"
    if stage == "delay sweep":
        played = [p for p in record.points if p.success_rate is not None and p.mode == "async"]
        if not played:
            return "no async point could be played"
        at = max(played, key=lambda p: p.ticks)
        return f"async holds {at.success_rate:.1%} at {at.ticks} ticks"
    if stage == "register":
        return f"v{record.version} {', '.join(record.aliases)}"
    if stage == "deploy":
        return f"{record.device}: v{record.model_version} {record.state}"
    return ""


def status_lines(stage: str, listener: Listener) -> Callable[[str], None]:
    """A stage's ``on_status``: each line (waiting for another run, taking over a dead one's
    output, reusing it) is said on ``listener``: a verb's display prints it, and inside a flow
    the Prefect tasks' listener puts it in the flow run's log."""

    def report(line: str) -> None:
        listener.said(stage, line)

    return report
