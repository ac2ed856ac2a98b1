"""The pipeline run's report: a markdown summary, tables and the training-curve plot.

The same markdown is ``summary.md`` in the run folder (also an artifact of the MLflow run), and
the Prefect flow run's summary artifact. It opens anywhere: its images are the PNGs in
``plots/`` beside it (in the Prefect artifact the same PNGs inline, as ``data:`` URIs: Prefect's
UI cannot read files, and its markdown renderer lets ``data:image`` sources through), its paths
are relative to the home, and it links only to servers the user configured
(:func:`configured_links`), never to the ports a ``robo-pipe ui`` happened to use. Built from the
typed stage records only.
"""

from __future__ import annotations

import base64
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from pipelines.records import (
    EdgeDeployment,
    Evaluation,
    FleetResult,
    PipelineResult,
    RunRecords,
)
from pipelines.tracking import MLFLOW_CLASSIC_VIEW, mlflow_page
from robo_pipe.names import slug
from stages.evaluate.failures import breakdown_line
from stages.evaluate.report import comparison_markdown
from stages.finetune.checkpoints import read_metrics

if TYPE_CHECKING:
    from deploy_edge.bundle.io_spec import Variant
    from deploy_edge.latency_report import LatencyReport
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef
    from stages.register import Gate


def plot_training_curves(checkpoints: dict[str, CheckpointRef | None], out: Path) -> Path | None:
    """Action loss against step for each BC checkpoint (``{"pretrain": ref, ...}``); for an RL
    one, the rolling success of its training episodes against env steps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # Here, not at the top: stages.finetune.rl loads torch and peft (3 s), and every fleet
    # command imports this module for its artifact.
    from stages.finetune.rl import rolling_success

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


def export_variants(export: ExportRef) -> tuple[Variant, ...]:
    """The export's precision variants as its bundle's spec has them now (with the success
    test's figures, which the evaluation wrote after the export); the export record's when
    the bundle is gone."""
    from deploy_edge.bundle.io_spec import IOSpecError, read_io_spec

    try:
        return read_io_spec(export.path).variants
    except IOSpecError:
        return export.variants


def variants_table(variants: tuple[Variant, ...]) -> list[dict[str, str]]:
    """One row per variant: its error against FP32 (robot units and relative to the action
    std), its held-out success against FP32 on the same seeds when measured, and whether it
    may ship."""
    rows = []
    for v in variants:
        s = v.success
        success = (
            f"{_pct(s['rate'])} vs {_pct(s['fp32_rate'])} FP32, p {s['p_value']:.3g} "
            f"({s['episodes']:.0f} paired episodes)"
            if s
            else "not measured"
        )
        rows.append(
            {
                "variant": v.name,
                "mean abs error": f"{v.action_error:.1e}",
                "error / action std": f"{v.relative_error:.1%}",
                "held-out success": success,
                "ships": "yes" if v.candidate else f"NO: {v.reason}",
            }
        )
    return rows


def _table(rows: list[dict[str, str]]) -> list[str]:
    """Markdown table lines of ``rows`` (the first row's keys are the header)."""
    head = list(rows[0])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return lines + ["| " + " | ".join(r[k] for k in head) + " |" for r in rows]


def latency_table(latency: LatencyReport) -> list[dict[str, Any]]:
    """The latency gate's figures as one table row (an ``async`` gate's own figures too)."""
    row: dict[str, Any] = {
        "target": latency.target,
        "result": "pass" if latency.passed else "FAIL",
        "p50 ms": round(latency.p50_ms, 2),
        "p95 ms": round(latency.p95_ms, 2),
        "p99 ms": round(latency.p99_ms, 2),
        "max ms": round(latency.max_ms, 2),
        "budget ms": latency.budget_ms,
        "misses": latency.misses,
    }
    if latency.mode == "async":
        row |= {
            "inference p99 ms": _rounded(latency.inference_p99_ms),
            "action age p99 ms": _rounded(latency.action_age_p99_ms),
            "largest seam jump": latency.seam_jump_max,
        }
    return [row]


def _rounded(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 2)


def gate_result(gate: Gate) -> str:
    """``pass``, ``FAIL``, or ``fail (not enforced)``."""
    return "pass" if gate.passed else ("FAIL" if gate.enforced else "fail (not enforced)")


def gates_table(gates: dict[str, Gate]) -> list[dict[str, str]]:
    """One row per promotion gate: its result, what was measured and what was required, as
    plain text a table cell shows as written (``>= 70%`` is a Markdown blockquote in a renderer
    that parses a cell on its own: it reads ``≥ 70%``)."""
    return [
        {
            "gate": name,
            "result": gate_result(gate),
            "measured": _plain(gate.measured),
            "required": _plain(gate.required),
        }
        for name, gate in gates.items()
    ]


def _plain(text: str) -> str:
    return text.replace(">=", "≥").replace("<=", "≤")


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


# -- where the run can be found ------------------------------------------------------------------


@dataclass(frozen=True)
class RunPlaces:
    """Where a pipeline run can be looked at later: its run folder under the home, its Prefect
    flow run and its MLflow run (names and ids, which do not depend on any server's address)."""

    home: Path
    flow_run_name: str
    flow_run_id: str
    experiment: str
    experiment_id: str
    mlflow_run_id: str
    links: dict[str, str]
    """Only links to servers the user configured (:func:`configured_links`)."""

    def relative(self, path: str | Path) -> str:
        """``path`` relative to the home (as it is when it lies outside the home)."""
        return home_relative(path, self.home)


def home_relative(path: str | Path, home: Path) -> str:
    """``path`` relative to ``home``, or as it is when it lies outside it (a base model in
    another folder)."""
    for candidate, base in ((Path(path), home), (Path(path).resolve(), home.resolve())):
        if candidate.is_relative_to(base):
            return str(candidate.relative_to(base))
    return str(path)


def configured_links(
    places: RunPlaces,
    model: str,
    version: str,
    env: dict[str, str] | None = None,
    local_prefect_api: str | None = None,
) -> dict[str, str]:
    """Links to the run's pages on servers the user configured, which a reader can follow
    later: Prefect's when ``PREFECT_UI_URL`` is set, or ``PREFECT_API_URL`` names a server other
    than ``local_prefect_api`` (the one a ``robo-pipe ui`` or ``serve`` started on this home);
    MLflow's when ``MLFLOW_TRACKING_URI`` is a tracking server (it is its own UI). None to the
    servers robo-pipe started, whose ports change from one start to the next: the summary says
    how to open the run there instead."""
    env = dict(os.environ) if env is None else env
    links = {}
    api = env.get("PREFECT_API_URL", "").rstrip("/")
    configured_api = api if api and api != (local_prefect_api or "").rstrip("/") else ""
    prefect_ui = env.get("PREFECT_UI_URL", "").rstrip("/") or configured_api.removesuffix("/api")
    if prefect_ui:
        links["Prefect flow run"] = f"{prefect_ui}/runs/flow-run/{places.flow_run_id}"
    tracking = env.get("MLFLOW_TRACKING_URI", "")
    if urlparse(tracking).scheme in ("http", "https"):
        route = f"experiments/{places.experiment_id}/runs/{places.mlflow_run_id}"
        links["MLflow run"] = mlflow_page(tracking, route)
        links["MLflow model version"] = mlflow_page(tracking, f"models/{model}/versions/{version}")
    return links


def where_to_look(result: PipelineResult, places: RunPlaces) -> list[str]:
    """The summary's last section: where the run is, and how to open it in the UIs."""
    uri = f"models:/{result.model_name}/{result.version}"
    lines = [
        "## Where to look",
        "",
        "Paths are relative to the robo-pipe home (`$ROBO_PIPE_HOME`, or the `.robo-pipe` folder "
        "robo-pipe finds from where it runs); the plots are in `plots/` beside this file.",
        "",
        f"- Run folder: `{places.relative(result.run_dir)}`.",
        f"- Registry: `{uri}`, aliases {', '.join(result.aliases)} "
        f"(`robo-pipe models show {uri}`).",
        f"- Prefect: flow run `{places.flow_run_name}` (id `{places.flow_run_id}`).",
        f"- MLflow: experiment `{places.experiment}`, run id `{places.mlflow_run_id}`.",
        "",
        "To open them: `robo-pipe ui` on this home, then the pages at these routes of the UIs "
        f"it prints: Prefect `runs/flow-run/{places.flow_run_id}`, MLflow "
        f"`#/experiments/{places.experiment_id}/runs/{places.mlflow_run_id}?"
        f"{MLFLOW_CLASSIC_VIEW}`. Set `PREFECT_UI_URL` (or use an MLflow tracking server) and "
        "the summary links to them.",
    ]
    if places.links:
        lines += ["", "On the servers configured for this run:", ""]
        lines += [f"- {label}: {url}" for label, url in places.links.items()]
    return lines


def data_uri(png: Path) -> str:
    """``png`` inline, as a ``data:`` URI (what an image in a Prefect markdown artifact can be)."""
    return "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode()


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
    from deploy_edge.latency_report import async_line, encode_line  # as the CLI says them

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
        "",
        "## Data and training",
        "",
        f"- Dataset `{rel(dataset.path)}`: {dataset.episodes} episodes, {dataset.frames} "
        f"frames, source success {_pct(dataset.source_success_rate)}, hash "
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
        lines += _table(variants_table(variants))
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


# -- fleet rollouts ------------------------------------------------------------------------------


def fleet_artifact_key(model: str) -> str:
    """The Prefect artifact key of ``model``'s rollout summaries."""
    return f"fleet-{slug(model) or 'model'}"


def summary_markdown(result: FleetResult) -> str:
    """The rollout as markdown: the verdict, then one table row per device."""
    verdict = (
        f"**cancelled** by {result.reason}; {result.rolled_back}"
        if result.cancelled_by
        else f"**stopped at wave {result.stopped_at_wave}**: {result.reason}; {result.rolled_back}"
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
