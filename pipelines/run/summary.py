"""The run's outcome and its markdown summary.

The same markdown is ``summary.md`` in the run folder (also an artifact of the MLflow run), and
the Prefect flow run's summary artifact. It opens anywhere: its images are the PNGs in
``plots/`` beside it (in the Prefect artifact the same PNGs inline, as ``data:`` URIs: Prefect's
UI cannot read files, and its markdown renderer lets ``data:image`` sources through), its paths
are relative to the home, and it links only to servers the user configured
(:func:`~pipelines.run.places.configured_links`), never to the ports a ``robo-pipe ui`` happened
to use. Built from the typed stage records only; its tables are :mod:`pipelines.run.tables`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.records import EdgeDeployment, PipelineResult, RunRecords
from pipelines.run.places import RunPlaces, where_to_look
from pipelines.run.tables import (
    evaluation_table,
    export_variants,
    gate_result,
    interval,
    markdown_table,
    percent,
    variants_table,
)
from stages.evaluate.report import comparison_markdown, rl_gain_words

if TYPE_CHECKING:
    from stages.policy.checkpoint import CheckpointRef


def _training_result(ckpt: CheckpointRef) -> str:
    metrics = ckpt.metrics
    if "env_steps" in metrics:  # RL fine-tuning after (or instead of) BC
        return (
            f"{ckpt.step} RL iterations, {int(metrics['env_steps']):,} env steps, last round's "
            f"training-episode success {percent(metrics.get('success_rate', float('nan')))}."
        )
    return f"{ckpt.step} steps, final action loss {metrics.get('action_loss', 0):.4f}."


def _device_result(device: EdgeDeployment, rel: Callable[[str], str]) -> str:
    if device.state != "active":
        return f"`{device.device}` {device.state} v{device.model_version}: {device.reason}"
    gate = f"on-device p99 {device.p99_ms:.2f} ms" if device.p99_ms is not None else "no gate"
    episode = (
        f"one episode of {device.episode_ticks} ticks, p99 {device.episode_p99_ms:.2f} ms"
        if device.episode_p99_ms is not None
        else "no episode"
    )
    return (
        f"`{device.device}` runs v{device.model_version} ({gate}; {episode}); its state: "
        f"`{rel(device.state_dir)}`."
    )


# -- the run's outcome ---------------------------------------------------------------------------

VERDICT_STATES = {
    "promoted": "Promoted",
    "blocked": "Blocked",
    "refused": "Refused",
    "rollout-stopped": "Rollout stopped",
}
"""The name of the flow run's final (Completed) state for each :attr:`PipelineResult.verdict`:
what Prefect's run lists show in the state column."""


def outcome(result: PipelineResult) -> str:
    """The run's outcome in a few words, as the flow run's name, the summary's title and the
    MLflow run's description give it: ``promoted v3``, ``v4 BLOCKED (latency)``, ``v3 promoted,
    REFUSED on local-agent``, ``v3 promoted, rollout STOPPED at wave 1``."""
    version = f"v{result.version}"
    verdict = result.verdict
    if verdict == "blocked":
        return f"{version} BLOCKED ({', '.join(result.blocked_by)})"
    if verdict == "refused" and result.device is not None:
        state = result.device.state.replace("_", " ").upper()
        return f"{version} promoted, {state} on {result.device.device}"
    if verdict == "rollout-stopped" and result.rollout is not None:
        wave = result.rollout.stopped_at_wave
        return f"{version} promoted, rollout " + (
            f"STOPPED at wave {wave}" if wave is not None else "INCOMPLETE"
        )
    return f"promoted {version}"


def run_title(result: PipelineResult) -> str:
    """``<config name> · <outcome>``: the flow run's name once the run is over."""
    return f"{result.config_name} · {outcome(result)}"


# -- the summary ---------------------------------------------------------------------------------


def markdown(
    result: PipelineResult, records: RunRecords, images: dict[str, str], places: RunPlaces
) -> str:
    """The run summary (see module docstring); ``images`` maps plot names to where the image
    is: a path relative to the summary (``summary.md``) or a ``data:`` URI (the Prefect
    artifact)."""
    dataset, ckpt, reg = records.dataset, records.checkpoint, records.registration
    evaluation, latency = records.evaluation, records.latency
    cand = evaluation.candidate
    rel = places.relative
    lines = [
        f"# {run_title(result)}",
        "",
        f"`models:/{result.model_name}/{reg.version}`: "
        + ("**champion**" if reg.promoted else "candidate (champion unchanged)")
        + f". Pipeline `{result.config_name}` (config hash `{result.config_hash}`), "
        f"run folder `{rel(result.run_dir)}`.",
        "",
        "## Gates",
        "",
        "| gate | result | measured | required |",
        "|---|---|---|---|",
    ]
    for name, gate in reg.gates.items():
        lines.append(f"| {name} | {gate_result(gate)} | {gate.measured} | {gate.required} |")
    lines += [
        "",
        "## Evaluation of the exported policy (ONNX Runtime, what ships)",
        "",
        "| policy | variant | episodes | success | 95% CI |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {r['policy']} | {r['variant']} | {r['episodes']} | {r['success']} | {r['95% CI']} |"
        for r in evaluation_table(evaluation)
    ]
    start, warm = evaluation.start, evaluation.warm_start
    if start:
        lines += [
            "",
            f"Fine-tuning took held-out success from {percent(start.success_rate)} (the model it "
            f"started from) to {percent(cand.success_rate)}.",
        ]
    if warm:
        overlap = cand.ci95[0] <= warm.ci95[1] and warm.ci95[0] <= cand.ci95[1]
        lines += [
            "",
            f"RL in simulation took it from {percent(warm.success_rate)} "
            f"({interval(warm.ci95)}, the BC warm start) to {percent(cand.success_rate)} "
            f"({interval(cand.ci95)}): "
            f"{100 * (cand.success_rate - warm.success_rate):+.1f} points on the same seeds; "
            f"the 95% intervals {'overlap' if overlap else 'do not overlap'}.",
        ]
    if evaluation.rl_gain:
        words = rl_gain_words(evaluation.rl_gain)
        lines += ["", f"{words[0].upper()}{words[1:]}."]
    failures = [(role, r) for role, r in (("candidate", cand), ("BC warm start", warm)) if r]
    if any(r.failures for _, r in failures):
        lines += [
            "",
            "Why episodes failed: "
            + "; ".join(f"{role}: {r.why_failed()}" for role, r in failures if r.failures)
            + ".",
        ]
    if cand.comparison:
        lines += comparison_markdown(cand.comparison)
    from deploy_edge.latency_report import async_line, encode_line

    async_figures = async_line(latency) if latency.mode == "async" else ""
    encoding = encode_line(latency)  # "" unless the bundle has an instruction graph
    lines += [
        "",
        "## Latency gate (whole control step on this machine)",
        "",
        "| target | p50 ms | p95 ms | p99 ms | max ms | budget ms | misses |",
        "|---|---|---|---|---|---|---|",
        f"| {latency.target} | {latency.p50_ms:.2f} | {latency.p95_ms:.2f} | "
        f"{latency.p99_ms:.2f} | {latency.max_ms:.2f} | {latency.budget_ms:g} | "
        f"{latency.misses} |",
        "",
        *([f"Inference off the tick ({async_figures}).", ""] if async_figures else []),
        *([f"{encoding[0].upper()}{encoding[1:]}.", ""] if encoding else []),
        "Measured on " + ", ".join(f"{k} {v}" for k, v in latency.measured_on.items()) + ".",
        *_sweep_lines(Path(latency.report).with_name("delay_sweep.json")),
        "",
        "## Data and training",
        "",
        f"- Dataset `{rel(dataset.path)}`: {dataset.episodes} episodes, {dataset.frames} "
        f"frames, source success {percent(dataset.source_success_rate)}, hash "
        f"`{dataset.content_hash[:16]}`.",
        f"- Policy: {ckpt.policy_type}, trains {ckpt.trainable} "
        f"({ckpt.trainable_params:,} of {ckpt.total_params:,} parameters), "
        + _training_result(ckpt),
    ]
    base = records.base
    if base:
        lines.append(
            f"- Base: `{rel(base.path)}` ({base.step} steps, hash `{base.content_hash[:12]}`)."
        )
    export = records.export
    weights = "; **random weights: systems test only**" if export.random_weights else ""
    lines.append(
        f"- Export: `{rel(export.path)}`, opset {export.opset}, parity "
        f"{export.parity_max_abs_error:.1e} (ONNX Runtime vs torch), "
        f"{export.parameters:,} parameters, {export.export_seconds:.1f} s, peak RSS "
        f"{export.export_peak_rss_mb:,.0f} MiB{weights}."
    )
    variants = export_variants(export)
    if variants:
        lines += ["", "## Precision variants (scored against FP32 before they ship)", ""]
        lines += markdown_table(variants_table(variants))
    lines += [
        "",
        "## Stages",
        "",
        "| stage | seconds | reused from an earlier run |",
        "|---|---|---|",
    ]
    for stage, timing in result.stages.items():
        lines.append(f"| {stage} | {timing.seconds:.1f} | {'yes' if timing.reused else ''} |")
    if records.device:
        lines += ["", "## On the device", "", _device_result(records.device, rel)]
    if images:
        lines += ["", "## Plots"]
    for name, source in images.items():
        lines += ["", f"### {name}", "", f"![{name}]({source})"]
    lines += ["", *where_to_look(result, places)]
    return "\n".join(lines) + "\n"


def _sweep_lines(path: Path) -> list[str]:
    """The delay sweep's section (``latency.sweep``), or nothing where none was played."""
    if not path.is_file():
        return []
    from stages.evaluate.sweep import DelaySweep, mark_lines, sweep_table

    sweep = DelaySweep.from_json(json.loads(path.read_text()))
    return [
        "",
        "## Success against inference delay",
        "",
        f"The held-out suite ({sweep.seeds} seeds of each of {', '.join(sweep.variants)}, the "
        f"same at every delay) played as a robot whose inference takes that long; a chunk of "
        f"{sweep.chunk_len} actions; the device's delay: {sweep.expected}.",
        "",
        *sweep_table(sweep),
        "",
        *mark_lines(sweep),
    ]
