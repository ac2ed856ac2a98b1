"""The result tables the verbs print of a stage's record: a trained checkpoint, an evaluation,
the latency gate, ``precision: auto``'s trials and the whole pipeline's result (on ``out``: the
verb's :func:`~pipelines.cli.common.result_console`, stdout unless ``--json``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from pipelines.cli.common import console
from stages.evaluate.report import comparison_line, rl_gain_words

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport
    from deploy_edge.wire import Trial
    from pipelines.records import PipelineResult
    from pipelines.services.settings import Services
    from stages.evaluate.report import EvalReport
    from stages.evaluate.sweep import DelaySweep
    from stages.policy.checkpoint import CheckpointRef


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
        out.print(f"why episodes failed: {report.why_failed()}", highlight=False)
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
        f"{report.jitter_ms:.2f} ms; misses {report.misses}{_deadline(report)}; "
        f"{report.measured_on['engine']}; report: {report.report}"
    )
    if report.rate_note:  # the profile's what-if rate, not the policy's own
        out.print(f"note: {report.rate_note}", highlight=False)
    if report.mode == "async":  # what the asynchronous loop was judged on besides its tick
        from deploy_edge.latency_report import async_line

        out.print(async_line(report), highlight=False)
    if report.instruction_encode_p50_ms is not None:  # once per episode: beside the tick's
        from deploy_edge.latency_report import encode_line

        out.print(encode_line(report), highlight=False)


def show_sweep(sweep: DelaySweep, run_dir: Path, out: Console = console) -> None:
    """The delay sweep: a row per delay, success per mode (or why it was not played), the
    device's delay marked."""
    from rich.markup import escape

    from stages.evaluate.sweep import MODES, delay_label, point_words

    table = Table(
        title=f"success against inference delay: {sweep.seeds} seeds of each of "
        f"{', '.join(sweep.variants)}, the same at every delay"
    )
    for col in ("delay", *MODES):
        table.add_column(col)
    for d in sorted({p.ticks for p in sweep.points}):
        cells = [escape(point_words(sweep.point(mode, d))) for mode in MODES]
        table.add_row(escape(delay_label(sweep, d)), *cells)
    out.print(table)
    if sweep.expected:
        out.print(f"the device's delay: {escape(sweep.expected)}", highlight=False)
    if sweep.marks:  # their sources are in delay_sweep.md
        marks = "; ".join(f"{m.label} {m.inference_ms:g} ms = {m.ticks} ticks" for m in sweep.marks)
        out.print(f"where real VLAs would sit: {escape(marks)}", highlight=False)
    out.print(f"sweep: {run_dir / 'delay_sweep.md'}", highlight=False)


def _deadline(report: LatencyReport) -> str:
    """The tick deadline and the rate it is a period of, said after the misses ("" for a
    report from before rates were recorded)."""
    if report.deadline_ms is None or report.control_hz is None:
        return ""
    return f" (tick deadline {report.deadline_ms:g} ms, {report.control_hz:g} Hz)"


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
            f"{'overlap' if result.ci95[0] <= high else 'do not overlap'}"
            + (f"; {rl_gain_words(result.rl_gain)})" if result.rl_gain else ")")
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
