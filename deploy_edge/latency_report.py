"""The latency gate's report: its record, and the files and lines it is shown as.

:class:`LatencyReport` is what the gate (:mod:`deploy_edge.latency`) decides and measures; the
gate writes it as ``latency.md`` (a table, the histogram, with ``precision: auto`` every way the
bundle could run and why it was or was not chosen), ``latency_report.json`` and ``latency.png``
(:func:`write_with_histogram`); :func:`async_line` and :func:`encode_line` say its ``async`` and
instruction-encoding figures in one line each, as the CLI and the run summary show them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from deploy_edge.precision import error_text
from deploy_edge.wire import Trial
from robo_pipe.home import mark_home
from robo_pipe.records import Record


@dataclass
class LatencyReport(Record):
    """The gate's result (a record: ``to_json`` / ``from_json``)."""

    export: str
    target: str
    passed: bool
    reasons: list[str]
    """Why it failed (empty when it passed)."""
    budget_ms: float
    allowed_misses: int
    steps: int
    warmup: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float
    mean_ms: float
    jitter_ms: float
    """Standard deviation of the step latency."""
    misses: int
    errors: int
    inference_ticks: int
    measured_on: dict[str, str] = field(default_factory=dict)
    """Engine, precision, hardware and software versions."""
    report: str = ""
    histogram: str = ""
    variant: str = ""
    """What of the bundle was measured (:attr:`~deploy_edge.wire.Trial.variant`): the pinned
    one, or the one ``precision: auto`` chose (the figures above are its)."""
    trials: list[Trial] = field(default_factory=list)
    """With ``precision: auto``: every way the bundle could run, its p99, and why it was or was
    not chosen; empty for a pinned precision."""
    choice: str = ""
    """With ``precision: auto``: why :attr:`variant` runs, or why none does."""
    mode: str = "sync"
    """The loop measured: ``sync`` or ``async`` (the figures below are ``async``'s; None in
    ``sync``)."""
    inference_p50_ms: float | None = None
    """Inference alone, back to back before the loop ran."""
    inference_p99_ms: float | None = None
    action_age_p50_ms: float | None = None
    """Observation taken -> action sent, over the ticks that sent a policy action."""
    action_age_p99_ms: float | None = None
    seam_jump_max: float | None = None
    """The largest change of any action dimension where a new chunk took over, robot units
    (None: no seam in the measured ticks)."""
    instruction_encode_p50_ms: float | None = None
    """A bundle with an instruction graph: encoding one instruction (tokenization and the
    instruction graph), the once-per-episode cost not in the tick figures, p50; None: the
    policy graph takes the tokens every tick."""
    instruction_encode_max_ms: float | None = None
    """The same, the slowest of the runs."""
    control_hz: float | None = None
    """The rate the ticks were judged at (:func:`deploy_edge.targets.control_rate`: the
    bundle's, unless the profile set a what-if); None: a report from before rates were
    recorded."""
    deadline_ms: float | None = None
    """A tick's deadline, one period of :attr:`control_hz`; a tick past it is a miss."""
    rate_note: str = ""
    """One line when the profile's rate overrode the bundle's (:func:`~deploy_edge.targets.
    rate_note`); "" when the policy ran at its own."""

    @property
    def inference_ms(self) -> float:
        """How long the robot waits for an inference on this target, ms: the async loop's
        inference p99, else the tick's p99 (a sync loop infers inside the tick)."""
        return self.inference_p99_ms if self.inference_p99_ms is not None else self.p99_ms


def encode_line(report: LatencyReport) -> str:
    """The once-per-episode instruction encoding in one line; "" when the bundle has no
    instruction graph."""
    if report.instruction_encode_p50_ms is None:
        return ""
    return (
        f"instruction encoding, once per episode (not in the tick figures): p50 "
        f"{report.instruction_encode_p50_ms:.2f} ms, max {report.instruction_encode_max_ms:.2f} ms"
    )


def async_line(report: LatencyReport) -> str:
    """An ``async`` gate's own figures in one line (inference alone, action age, seams), as
    the CLI and the run summary show them."""

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    seam = "-" if report.seam_jump_max is None else f"{report.seam_jump_max:.4g}"
    return (
        f"async: inference p50 {ms(report.inference_p50_ms)} p99 {ms(report.inference_p99_ms)} "
        f"ms; action age p50 {ms(report.action_age_p50_ms)} p99 "
        f"{ms(report.action_age_p99_ms)} ms; largest seam jump {seam} (robot units)"
    )


def _async_rows(report: LatencyReport) -> list[tuple[str, str]]:
    """The ``async`` figures of ``latency.md`` (none in ``sync``)."""
    if report.mode != "async":
        return []

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    seam = "-" if report.seam_jump_max is None else f"{report.seam_jump_max:.4g}"
    return [
        (
            "inference p50 / p99",
            f"{ms(report.inference_p50_ms)} / {ms(report.inference_p99_ms)} ms",
        ),
        (
            "action age p50 / p99",
            f"{ms(report.action_age_p50_ms)} / {ms(report.action_age_p99_ms)} ms",
        ),
        ("largest seam jump", f"{seam} (robot units)"),
    ]


def write_with_histogram(report: LatencyReport, ms: np.ndarray, out: Path) -> None:
    """``latency.png`` (the step latencies ``ms`` against the p99 and the budget) and
    :func:`write_report` beside it, in ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(ms, bins=60, color="#4c72b0")
    for value, label, style in ((report.p99_ms, "p99", "-"), (report.budget_ms, "budget", "--")):
        ax.axvline(value, color="black", ls=style, label=f"{label} {value:.1f} ms")
    ax.set_xlabel("control step latency, ms (observation in -> action out)")
    ax.set_ylabel("steps")
    if report.instruction_encode_p50_ms is not None:
        ax.set_title(encode_line(report).replace(" (not in the tick figures)", ""), fontsize=8)
    ax.legend()
    fig.tight_layout()
    report.histogram = str(out / "latency.png")
    fig.savefig(report.histogram, dpi=100)
    plt.close(fig)
    report.report = str(out / "latency.md")
    write_report(report, out, "latency.png")


def write_report(report: LatencyReport, out: Path, histogram: str | None) -> None:
    """``latency.md`` (the histogram at ``histogram``, relative to ``out``; None: no loop ran)
    and ``latency_report.json``."""
    verdict = "PASSED" if report.passed else "FAILED: " + "; ".join(report.reasons)
    rows = [
        (
            "p50 / p95 / p99 / max",
            f"{report.p50_ms:.2f} / {report.p95_ms:.2f} / "
            f"{report.p99_ms:.2f} / {report.max_ms:.2f} ms",
        ),
        ("jitter (std)", f"{report.jitter_ms:.2f} ms"),
        ("deadline misses", f"{report.misses} (allowed {report.allowed_misses})"),
        *(
            [("tick deadline", f"{report.deadline_ms:g} ms ({report.control_hz:g} Hz)")]
            if report.deadline_ms is not None and report.control_hz is not None
            else []
        ),
        ("steps", f"{report.steps} after {report.warmup} warm-up"),
        ("variant", report.variant or "-"),
        ("mode", report.mode),
        *_async_rows(report),
        *(
            [
                (
                    "instruction encoding, once per episode (p50 / max)",
                    f"{report.instruction_encode_p50_ms:.2f} / "
                    f"{report.instruction_encode_max_ms or 0:.2f} ms (not in the tick figures)",
                )
            ]
            if report.instruction_encode_p50_ms is not None
            else []
        ),
        *report.measured_on.items(),
    ]
    lines = [
        f"# Latency gate on `{report.target}`: {verdict}",
        "",
        f"Budget: p99 <= {report.budget_ms:g} ms. Export: `{report.export}`.",
        *([f"Note: {report.rate_note}."] if report.rate_note else []),
        "",
        "| | |",
        "|---|---|",
        *[f"| {k} | {v} |" for k, v in rows],
    ]
    if histogram is not None:
        lines += ["", f"![latency histogram]({histogram})"]
    if report.trials:
        lines += [
            "",
            f"## precision: auto — {report.choice}",
            "",
            "| variant | precision | error / action std | p99 | result |",
            "|---|---|---|---|---|",
            *[
                f"| {t.variant} | {t.precision} | {error_text(t)} | "
                f"{'-' if t.p99_ms is None else f'{t.p99_ms:.2f} ms'} | "
                f"{'chosen' if t.chosen else t.failure} |"
                for t in report.trials
            ],
        ]
    report.report = str(out / "latency.md")
    # Paths inside the robo-pipe home as $ROBO_PIPE_HOME/...: the home can move (robo_pipe.home).
    (out / "latency.md").write_text(mark_home("\n".join(lines) + "\n"))
    (out / "latency_report.json").write_text(json.dumps(mark_home(report.to_json()), indent=1))
