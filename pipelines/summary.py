"""The pipeline run's report: a markdown summary, tables and the training-curve plot.

The same markdown is the Prefect flow run's summary artifact, ``summary.md`` in the run folder
and an artifact of the MLflow run. Built from the typed stage records only.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.records import (
    EdgeDeployment,
    Evaluation,
    FleetResult,
    PipelineResult,
    RunRecords,
)
from robo_pipe.names import slug
from stages.evaluate.failures import breakdown_line
from stages.evaluate.report import comparison_markdown
from stages.finetune.checkpoints import read_metrics
from stages.finetune.rl import rolling_success

if TYPE_CHECKING:
    from deploy_edge.latency import LatencyReport
    from stages.policy.checkpoint import CheckpointRef


def plot_training_curves(checkpoints: dict[str, CheckpointRef | None], out: Path) -> Path | None:
    """Action loss against step for each BC checkpoint (``{"pretrain": ref, ...}``); for an RL
    one, the rolling success of its training episodes against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {
        stage: read_metrics(Path(ref.path).parent) for stage, ref in checkpoints.items() if ref
    }
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return None
    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.2), squeeze=False)
    for ax, (stage, records) in zip(axes[0], curves.items(), strict=True):
        if "env_steps" in records[0]:  # RL fine-tuning: success of its training episodes
            steps = [r["env_steps"] for r in records]
            ax.plot(steps, rolling_success(records), label="training-episode success")
            ax.set_title(f"{stage} (RL, {records[-1]['env_steps_per_s']:,.0f} env-steps/s)")
            ax.set(xlabel="env steps", ylabel="success", ylim=(-0.02, 1.02))
        else:
            steps = [r["step"] for r in records]
            ax.plot(steps, [r["action_loss"] for r in records], label="action NLL")
            if "aux_loss" in records[0]:
                ax.plot(steps, [r["aux_loss"] for r in records], label="aux (object xy)", alpha=0.7)
            ax.set_title(f"{stage} ({records[-1]['samples_per_s']:,.0f} samples/s)")
            ax.set(xlabel="step", ylabel="loss")
        ax.legend()
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _training_result(ckpt: CheckpointRef) -> str:
    metrics = ckpt.metrics
    if "env_steps" in metrics:  # RL fine-tuning after (or instead of) BC
        return (
            f"{ckpt.step} RL iterations, {int(metrics['env_steps']):,} env steps, last "
            f"round's training-episode success {_pct(metrics.get('success_rate', float('nan')))}."
        )
    return f"{ckpt.step} steps, final action loss {metrics.get('action_loss', 0):.4f}."


def _device_result(device: EdgeDeployment) -> str:
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
        f"`{device.state_dir}`."
    )


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def _ci(ci: list[float] | tuple[float, float]) -> str:
    return f"{_pct(ci[0])} – {_pct(ci[1])}"


def evaluation_table(evaluation: Evaluation) -> list[dict[str, Any]]:
    """One row per (policy, variant) with success and its 95% interval: the table artifact."""
    rows = []
    roles = (
        ("candidate", evaluation.candidate),
        ("BC warm start", evaluation.warm_start),
        ("start", evaluation.start),
    )
    for role, report in roles:
        if report is None:
            continue
        lines = [(r.variant, r.episodes, r.success_rate, r.ci95) for r in report.rows]
        lines.append(("all", report.episodes, report.success_rate, report.ci95))
        for variant, episodes, success, ci95 in lines:
            rows.append(
                {
                    "policy": role,
                    "variant": variant,
                    "episodes": episodes,
                    "success": _pct(success),
                    "95% CI": _ci(ci95),
                }
            )
    return rows


def latency_table(latency: LatencyReport) -> list[dict[str, Any]]:
    """The latency gate's figures as one table row."""
    return [
        {
            "target": latency.target,
            "p50 ms": round(latency.p50_ms, 2),
            "p95 ms": round(latency.p95_ms, 2),
            "p99 ms": round(latency.p99_ms, 2),
            "max ms": round(latency.max_ms, 2),
            "budget ms": latency.budget_ms,
            "misses": latency.misses,
            "passed": latency.passed,
        }
    ]


def markdown(result: PipelineResult, records: RunRecords, images: dict[str, str]) -> str:
    """The run summary (see module docstring); ``images`` maps plot names to URLs."""
    dataset, ckpt, reg = records.dataset, records.checkpoint, records.registration
    evaluation, latency = records.evaluation, records.latency
    cand = evaluation.candidate
    lines = [
        f"# {result.model_name} v{reg.version}: "
        + ("**champion**" if reg.promoted else "candidate (champion unchanged)"),
        "",
        f"Pipeline `{result.config_name}` (config hash `{result.config_hash}`), "
        f"run folder `{result.run_dir}`.",
        "",
        "## Gates",
        "",
        "| gate | result | measured | required |",
        "|---|---|---|---|",
    ]
    for name, gate in reg.gates.items():
        verdict = "pass" if gate.passed else ("FAIL" if gate.enforced else "fail (not enforced)")
        lines.append(f"| {name} | {verdict} | {gate.measured} | {gate.required} |")
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
            f"Fine-tuning took held-out success from {_pct(start.success_rate)} (the model it "
            f"started from) to {_pct(cand.success_rate)}.",
        ]
    if warm:
        overlap = cand.ci95[0] <= warm.ci95[1] and warm.ci95[0] <= cand.ci95[1]
        lines += [
            "",
            f"RL in simulation took it from {_pct(warm.success_rate)} ({_ci(warm.ci95)}, the BC "
            f"warm start) to {_pct(cand.success_rate)} ({_ci(cand.ci95)}): "
            f"{100 * (cand.success_rate - warm.success_rate):+.1f} points on the same seeds; "
            f"the 95% intervals {'overlap' if overlap else 'do not overlap'}.",
        ]
    failures = [(role, r) for role, r in (("candidate", cand), ("BC warm start", warm)) if r]
    if any(r.failures for _, r in failures):
        lines += [
            "",
            "Why episodes failed: "
            + "; ".join(
                f"{role}: {breakdown_line(r.failures)}" for role, r in failures if r.failures
            )
            + ".",
        ]
    if cand.comparison:
        lines += comparison_markdown(cand.comparison)
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
        "Measured on " + ", ".join(f"{k} {v}" for k, v in latency.measured_on.items()) + ".",
        "",
        "## Data and training",
        "",
        f"- Dataset `{dataset.path}`: {dataset.episodes} episodes, {dataset.frames} "
        f"frames, source success {_pct(dataset.source_success_rate)}, hash "
        f"`{dataset.content_hash[:16]}`.",
        f"- Policy: {ckpt.policy_type}, trains {ckpt.trainable} "
        f"({ckpt.trainable_params:,} of {ckpt.total_params:,} parameters), "
        + _training_result(ckpt),
    ]
    base = records.base
    if base:
        lines.append(f"- Base: `{base.path}` ({base.step} steps, hash `{base.content_hash[:12]}`).")
    export = records.export
    lines.append(
        f"- Export: `{export.path}`, opset {export.opset}, parity "
        f"{export.parity_max_abs_error:.1e} (ONNX Runtime vs torch)."
    )
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
        lines += ["", "## On the device", "", _device_result(records.device)]
    lines += ["", "## Registry and links", ""]
    lines.append(
        f"- Registered `models:/{result.model_name}/{reg.version}`, aliases "
        f"{', '.join(reg.aliases)}."
    )
    for label, url in result.links.items():
        lines.append(f"- {label}: {url}")
    for name, url in images.items():
        lines += ["", f"### {name}", "", f"![{name}]({url})", "", f"{url}"]
    return "\n".join(lines) + "\n"


# -- fleet rollouts ------------------------------------------------------------------------------


def fleet_artifact_key(model: str) -> str:
    """The Prefect artifact key of ``model``'s rollout summaries."""
    return f"fleet-{slug(model) or 'model'}"


def summary_markdown(result: FleetResult) -> str:
    """The rollout as markdown: the verdict, then one table row per device."""
    verdict = (
        f"**stopped at wave {result.stopped_at_wave}**: {result.reason}; the devices it "
        "updated were rolled back"
        if result.stopped_at_wave is not None
        else "**complete**: every device runs it"
        if result.complete
        else "**done**, not every device runs it"
    )
    lines = [
        f"# Fleet rollout of {result.label}",
        "",
        f"Fleet `{result.fleet}`, {len(result.devices)} devices in {len(result.waves)} waves: "
        f"{verdict} ({result.seconds:.1f} s).",
        "",
        "| device | wave | before | after | state | reason | on-device p99 |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result.devices:
        p99 = f"{row.p99_ms:.2f} ms" if row.p99_ms is not None else "-"
        reason = row.reason.replace("|", "/").replace("\n", " ")
        lines.append(
            f"| {row.device} | {row.wave} | {row.before or '-'} | {row.after or '-'} | "
            f"{row.state} | {reason} | {p99} |"
        )
    return "\n".join(lines) + "\n"
