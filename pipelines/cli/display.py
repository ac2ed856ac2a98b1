"""What the verbs show: stage progress (a :class:`~pipelines.progress.Listener`: live rows in
a terminal, plain lines in a log) and the result tables (on ``out``: the verb's
:func:`~pipelines.cli.common.result_console`, stdout unless ``--json``)."""

from __future__ import annotations

import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from rich.console import Console
from rich.progress import BarColumn, Progress, Task, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from pipelines.cli.common import console
from pipelines.progress import Listener, describe
from stages.evaluate.failures import breakdown_line
from stages.evaluate.report import comparison_line

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport
    from deploy_edge.wire import Trial
    from pipelines.records import PipelineResult
    from pipelines.services.settings import Services
    from stages.evaluate.report import EvalReport
    from stages.policy.checkpoint import CheckpointRef

T = TypeVar("T")

PROGRESS_EVERY_S = 30.0
"""Outside a terminal: how often a running stage prints its progress line, at least."""


def watched(out: Console) -> bool:
    """Whether a person watches ``out`` live: a terminal rich animates (not ``TERM=dumb``, not
    ``TTY_INTERACTIVE=0``). ``FORCE_COLOR`` makes rich treat a log file as a terminal, so the
    file must be a TTY as well: a CI log gets colours and plain lines, never cursor moves."""
    return out.is_interactive and out.file.isatty()


class StageDisplay(ABC):
    """What a verb shows of its stages' progress (a :class:`~pipelines.progress.Listener`):
    :class:`LiveRows` in a terminal, :class:`StageLog` in a log."""

    @abstractmethod
    def started(self, stage: str, total: float | None, unit: str) -> None:
        """``stage`` began: ``total`` units of ``unit`` (None: unknown)."""

    @abstractmethod
    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """``completed`` units done (0: only ``detail`` changed)."""

    @abstractmethod
    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """``stage`` ended with ``detail``; ``reused``: an earlier run's record."""

    @abstractmethod
    def said(self, stage: str, line: str) -> None:
        """A line to keep in the output."""

    def step(self, stage: str, run: Callable[[Listener], T]) -> T:
        """Run one step with its progress on this display; returns its record."""
        record = run(self)
        self.finished(stage, describe(stage, record), reused=False)
        return record


class OwnElapsed(TimeElapsedColumn):
    """A row's elapsed time, blank for a row the display only saw end (a reused stage, a
    device's step that reports its own duration in its status): it measured none of its own."""

    def render(self, task: Task) -> Text:
        """The elapsed time of a timed row, else nothing."""
        return super().render(task) if task.fields.get("timed") else Text("")


class LiveRows(StageDisplay):
    """One progress row per stage: name, bar, percent, the stage's status line, elapsed. Shown
    on ``out`` while :attr:`progress` is entered; ``transient``: gone when it exits; ``clock``
    gives the time in seconds (a test passes its own)."""

    def __init__(
        self, out: Console, transient: bool = False, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.progress = Progress(
            TextColumn("[bold]{task.description:>9}"),
            BarColumn(bar_width=30),
            TextColumn("{task.percentage:>3.0f}%"),
            TextColumn("{task.fields[detail]}"),
            OwnElapsed(),
            console=out,
            transient=transient,
            get_time=clock,
        )
        self.rows: dict[str, TaskID] = {}

    def _row(self, stage: str, total: float | None) -> TaskID:
        if stage not in self.rows:
            self.rows[stage] = self.progress.add_task(stage, total=total, detail="", timed=False)
        return self.rows[stage]

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """A (new) row for ``stage``; a known ``total`` makes it a bar (``unit`` is shown)."""
        row = self._row(stage, total)
        self.progress.reset(row, total=total, detail=unit, timed=True)

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """Move ``stage``'s bar to ``completed`` (0: keep it) and show ``detail``; a row first
        seen here is timed from now."""
        row = self._row(stage, None)
        if completed:
            self.progress.update(row, completed=completed, detail=detail, timed=True)
        else:
            self.progress.update(row, detail=detail, timed=True)

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """Fill ``stage``'s bar and show what it produced (a device step that failed in red)."""
        row = self._row(stage, 1)
        total = self.progress.tasks[row].total or 1
        note = " (reused from an earlier run)" if reused else ""
        style = "red" if detail.startswith("FAILED") else "green"
        self.progress.update(row, total=total, completed=total, detail=f"[{style}]{detail}{note}")

    def said(self, stage: str, line: str) -> None:
        """Print ``line`` above the rows (it stays when the live display is gone) and show it
        as ``stage``'s status."""
        self.progress.console.print(f"{stage}: {line}", highlight=False, soft_wrap=True)
        self.advanced(stage, 0, line)


@dataclass
class _Running:
    """What :class:`StageLog` knows of one stage."""

    since: float | None
    """When the log first heard of it (None: only its end was seen: no duration measured)."""
    last_line: float
    """When the log last printed a line about it."""
    total: float | None = None
    unit: str = ""
    completed: float = 0.0
    detail: str = ""
    ended: bool = False


class StageLog(StageDisplay):
    """Plain lines for a log (stderr is not a terminal: CI, ``make demo > log``), never wrapped
    (a path stays whole on its line):

    - one line per stage as it ends: ``collect: ok in 83.2 s: 2000 episodes, 120000 frames``,
      ``pretrain: reused (an earlier run's): step 600, loss 0.0123``; a device's step, whose
      status carries its own verdict and duration: ``verify: ok (3.5 s)``;
    - while a stage runs, a progress line at least every ``every_s`` seconds (:meth:`tick`):
      ``finetune: 45% (270 of 600 BC steps), 0:01:23 elapsed: loss 0.0123, 850 samples/s``;
    - what a stage says (waiting for another run), when it says it.

    ``clock`` gives the time in seconds (a test passes its own)."""

    def __init__(
        self,
        out: Console,
        every_s: float = PROGRESS_EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.out, self.every_s, self.clock = out, every_s, clock
        self.stages: dict[str, _Running] = {}
        self.lock = threading.Lock()  # the Prefect tasks report from their own threads

    def _print(self, line: str) -> None:
        self.out.print(line, markup=False, highlight=False, soft_wrap=True)

    def _running(self, stage: str) -> _Running:
        state = self.stages.get(stage)
        if state is None or state.ended:
            now = self.clock()
            state = self.stages[stage] = _Running(since=now, last_line=now)
        return state

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """``stage`` runs; started again (BC, then RL fine-tuning) it keeps its first start."""
        with self.lock:
            state = self._running(stage)
            state.total, state.unit, state.completed = total, unit, 0.0

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """Remember ``stage``'s progress for its next progress line."""
        with self.lock:
            state = self._running(stage)
            state.completed = completed or state.completed
            state.detail = detail

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """The stage's line: ok and its duration (measured from its start), or reused."""
        with self.lock:
            state = self.stages.get(stage)
            since = state.since if state is not None and not state.ended else None
            now = self.clock()
            self.stages[stage] = _Running(since=since, last_line=now, ended=True)
            if reused:
                self._print(f"{stage}: reused (an earlier run's): {detail}")
            elif since is None:  # only its end was seen: its detail says how it went
                self._print(f"{stage}: {detail}")
            else:
                self._print(f"{stage}: ok in {now - since:.1f} s: {detail}")

    def said(self, stage: str, line: str) -> None:
        """Print ``stage: line`` now."""
        with self.lock:
            state = self._running(stage)
            state.detail, state.last_line = line, self.clock()
            self._print(f"{stage}: {line}")

    def tick(self) -> None:
        """A progress line for each running stage whose last line is ``every_s`` old."""
        with self.lock:
            now = self.clock()
            for stage, state in self.stages.items():
                if not state.ended and now - state.last_line >= self.every_s:
                    state.last_line = now
                    self._print(_progress_line(stage, state, now))

    @contextmanager
    def ticking(self) -> Iterator[None]:
        """Call :meth:`tick` every second in a thread inside the block: a stage that reports
        nothing for minutes (a long export, a slow first shard) still shows it runs."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(min(1.0, self.every_s)):
                self.tick()

        thread = threading.Thread(target=loop, name="stage-log", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()


def _progress_line(stage: str, state: _Running, now: float) -> str:
    """``finetune: 45% (270 of 600 BC steps), 0:01:23 elapsed: <its latest status>``."""
    if state.total:
        share = state.completed / state.total
        done = f"{share:.0%} ({state.completed:,.0f} of {state.total:,.0f} {state.unit})"
    elif state.completed:
        done = f"{state.completed:,.0f} {state.unit}".rstrip()
    else:
        done = "running"
    since = now if state.since is None else state.since
    elapsed = timedelta(seconds=int(now - since))
    line = f"{stage}: {done}, {elapsed} elapsed"
    return f"{line}: {state.detail}" if state.detail else line


@contextmanager
def live(json_out: bool = False) -> Iterator[StageDisplay]:
    """The stages' progress on stderr: live rows in a terminal (with ``--json`` they disappear
    when done, leaving the terminal to the result); elsewhere plain lines (:class:`StageLog`)."""
    if not watched(console):
        log = StageLog(console)
        with log.ticking():
            yield log
        return
    rows = LiveRows(console, transient=json_out)
    with rows.progress:
        yield rows


def show_checkpoint(title: str, ref: CheckpointRef, seconds: float, out: Console = console) -> None:
    """A trained checkpoint: where, what trains, the final metrics, the base."""
    table = Table(title=title, show_header=False)
    table.add_row("checkpoint", ref.path)
    table.add_row("policy", f"{ref.policy_type}, trains {ref.trainable}, step {ref.step}")
    share = ref.trainable_params / max(1, ref.total_params)
    table.add_row(
        "parameters", f"{ref.trainable_params:,} trainable of {ref.total_params:,} ({share:.1%})"
    )
    metrics = ref.metrics
    if "action_loss" in metrics:  # behaviour cloning
        table.add_row("final action loss", f"{metrics['action_loss']:.4f}")
        table.add_row("samples/s", f"{metrics.get('samples_per_s', 0.0):,.0f}")
    elif "env_steps" in metrics:  # RL
        success = metrics.get("success_rate", float("nan"))
        table.add_row("training-episode success", "-" if success != success else f"{success:.0%}")
        table.add_row("env steps", f"{int(metrics['env_steps']):,}")
    if ref.base:
        table.add_row("base", f"{ref.base.kind} {ref.base.path}")
    table.add_row("wall time", f"{seconds:.1f} s")
    out.print(table)


def show_evaluation(title: str, report: EvalReport, out: Console = console) -> None:
    """Success per variant with 95% intervals, the gate against a baseline, throughput."""
    table = Table(title=title)
    for col in ("variant", "episodes", "success", "95% CI", "mean length"):
        table.add_column(col)
    for r in report.rows:
        ci = f"{r.ci95[0]:.1%} - {r.ci95[1]:.1%}"
        table.add_row(
            r.variant, str(r.episodes), f"{r.success_rate:.1%}", ci, f"{r.mean_length:.1f}"
        )
    ci = f"{report.ci95[0]:.1%} - {report.ci95[1]:.1%}"
    table.add_row("all", str(report.episodes), f"{report.success_rate:.1%}", ci, "")
    out.print(table)
    out.print(f"instructions: {report.phrasing} phrasings (evaluate.phrasing)", highlight=False)
    if report.failures:
        out.print(f"why episodes failed: {breakdown_line(report.failures)}", highlight=False)
    if report.delay:
        out.print(f"inference delay: {report.delay.describe()}", highlight=False)
    if report.comparison:
        c = report.comparison
        verdict = "[green]passed" if c.passed else "[red]FAILED"
        out.print(f"gate: {verdict}[/]: {comparison_line(c)}", highlight=False)
    out.print(
        f"{report.env_steps_per_s:,.0f} env-steps/s, {report.episodes_per_s:.1f} episodes/s; "
        f"report: {report.report}"
    )


def show_trials(
    title: str, trials: list[Trial], choice: str, out: Console = console, p99: str = "p99"
) -> None:
    """``precision: auto``: one row per way to run the bundle (its error relative to the action
    std, its p99 under the ``p99`` heading, chosen or why not), then the choice."""
    from rich.markup import escape

    table = Table(title=title)
    for col in ("variant", "precision", "error / action std", p99, "result"):
        table.add_column(col)
    for t in trials:
        error = "unscored" if t.relative_error is None else f"{t.relative_error:.2%}"
        ms = "-" if t.p99_ms is None else f"{t.p99_ms:.2f} ms"
        verdict = "[green]chosen" if t.chosen else f"[yellow]{escape(t.failure)}"
        table.add_row(t.variant, t.precision, error, ms, verdict)
    out.print(table)
    if choice:
        out.print(f"choice: {escape(choice)}", highlight=False)


def show_latency(report: LatencyReport, out: Console = console) -> None:
    """The latency gate's verdict and figures."""
    verdict = "[green]PASSED" if report.passed else "[red]FAILED: " + "; ".join(report.reasons)
    out.print(f"latency gate on {report.target}: {verdict}[/]")
    out.print(
        f"p50 {report.p50_ms:.2f}  p95 {report.p95_ms:.2f}  p99 {report.p99_ms:.2f}  "
        f"max {report.max_ms:.2f} ms (budget {report.budget_ms:g}); jitter "
        f"{report.jitter_ms:.2f} ms; misses {report.misses}; {report.measured_on['engine']}; "
        f"report: {report.report}"
    )
    if report.mode == "async":  # what the asynchronous loop was judged on besides its tick
        from deploy_edge.latency_report import async_line

        out.print(async_line(report), highlight=False)
    if report.instruction_encode_p50_ms is not None:  # once per episode: beside the tick's
        from deploy_edge.latency_report import encode_line

        out.print(encode_line(report), highlight=False)


def show_pipeline_result(
    result: PipelineResult, seconds: float, services: Services, out: Console = console
) -> None:
    """The registered version, its gates, how far fine-tuning moved it, where to look (the
    links point to ``services``' UIs)."""
    table = Table(title=f"gates for {result.model_name} v{result.version}")
    for col in ("gate", "result", "measured", "required"):
        table.add_column(col)
    for name, gate in result.gates.items():
        verdict = "[green]pass" if gate.passed else "[red]FAIL"
        if not gate.enforced:
            verdict += " (not enforced)"
        table.add_row(name, verdict, gate.measured, gate.required)
    out.print(table)
    uri = f"models:/{result.model_name}/{result.version}"
    if result.promoted:
        out.print(f"[green]registered {uri}: champion[/] (aliases {', '.join(result.aliases)})")
    else:
        out.print(
            f"[yellow]registered {uri} as candidate; champion unchanged[/] "
            f"(failed: {', '.join(result.blocked_by)})"
        )
    if result.start_success_rate is not None:
        out.print(
            f"held-out success {result.success_rate:.1%} "
            f"(95% CI {result.ci95[0]:.1%} - {result.ci95[1]:.1%}); the model it started "
            f"from: {result.start_success_rate:.1%}"
        )
    if result.warm_start_success_rate is not None and result.warm_start_ci95 is not None:
        low, high = result.warm_start_ci95
        out.print(
            f"RL took held-out success from {result.warm_start_success_rate:.1%} "
            f"(95% CI {low:.1%} - {high:.1%}, its BC warm start) to {result.success_rate:.1%} "
            f"({result.success_rate - result.warm_start_success_rate:+.1%} points; intervals "
            f"{'overlap' if result.ci95[0] <= high else 'do not overlap'})"
        )
    device = result.device
    if device and device.state == "active":
        out.print(
            f"[green]device {device.device} runs v{device.model_version}[/]: on-device p99 "
            f"{f'{device.p99_ms:.2f} ms' if device.p99_ms is not None else 'not measured'}; "
            "one episode there: "
            f"{'success' if device.episode_success else 'no success'} in "
            f"{device.episode_ticks} ticks, p99 {device.episode_p99_ms or 0:.2f} ms",
            highlight=False,
        )
    elif device:
        out.print(f"[red]device {device.device} {device.state}[/]: {device.reason}")
    if result.rollout:
        rollout = result.rollout
        running = sum(row.state == "active" for row in rollout.devices)
        verdict = "[green]complete" if rollout.complete else f"[red]stopped: {rollout.reason}"
        out.print(
            f"fleet {rollout.fleet}: {verdict}[/] ({running} of {len(rollout.devices)} devices "
            f"run v{rollout.model_version})",
            highlight=False,
        )
    out.print(f"pipeline took {seconds / 60:.1f} min; summary: {result.run_dir}/summary.md")
    for label, url in result.links.items():
        out.print(f"  {label}: {url}", highlight=False)
    local = [
        name
        for name, ui in (("MLflow", services.mlflow_ui), ("Prefect", services.prefect_ui))
        if not ui
    ]
    if local:  # no server of that kind was configured or running: the links are robo-pipe ui's
        out.print(
            f"  (the {' and '.join(local)} links answer while `robo-pipe ui` runs)", style="dim"
        )
