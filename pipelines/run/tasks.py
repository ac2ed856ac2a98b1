"""The pipeline's stages as Prefect tasks. Each calls its step (:mod:`pipelines.steps`) through
:func:`~pipelines.run.stage_task.run_stage`, which reuses the record of an earlier run when the
step's inputs are unchanged, logs the record to a nested MLflow run, and reports progress to the
listeners of this process (:mod:`pipelines.progress`). Every task takes the
:class:`~pipelines.run.stage_task.RunContext` and upstream records and returns its own typed
record.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines import tracking
from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.progress import BROADCAST
from pipelines.records import EdgeDeployment, Evaluation, Registration
from pipelines.registry.tags import ONNX_HASH_TAG
from pipelines.registry.versions import champion_to_beat, get_version
from pipelines.run.stage_task import RunContext, run_stage, stage_task
from pipelines.steps.collect import collect_dataset, default_dataset
from pipelines.steps.evaluate import evaluate_candidate
from pipelines.steps.export import export_checkpoint
from pipelines.steps.latency import measure_latency, play_at_device_delay, sweep_delays
from pipelines.steps.register import register_version
from pipelines.steps.training import finetune_policy, pretrain_base
from stages.evaluate.at_delay import AT_DELAY_FILE, read_at_delay

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport
    from stages.dataset.layout import DatasetRef
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef


def _path_hash_matches(hasher: Callable[[Path], str]) -> Callable[[Any], bool]:
    """The record's artifact at ``.path`` still has the hash the record says."""
    return lambda r: Path(r.path).exists() and hasher(Path(r.path)) == r.content_hash


def _checkpoint_hash(path: Path) -> str:
    from stages.policy.checkpoint import checkpoint_hash

    return checkpoint_hash(path)


def _sections(cfg: PipelineConfig, *names: str) -> dict[str, Any]:
    return cfg.model_dump(include=set(names), mode="json")


# -- the stages ----------------------------------------------------------------------------------


@stage_task("collect")
def collect_stage(ctx: RunContext) -> DatasetRef:
    """Demonstrations of the target task into a LeRobot v3 dataset (resumable)."""
    from stages.dataset.layout import DatasetRef
    from stages.dataset.reader import open_dataset

    cfg, target = ctx.cfg, default_dataset(ctx.cfg)
    inputs = {
        "config": _sections(cfg, "robot", "scene", "sim", "collect", "seed"),
        "path": str(target),
    }

    def track(run: tracking.TrackedRun, r: DatasetRef) -> None:
        run.log_params({"dataset": r.path, "dataset_hash": r.content_hash})
        run.log_metrics(
            {
                "episodes": r.episodes,
                "frames": r.frames,
                "source_success_rate": r.source_success_rate,
            }
        )

    def run() -> DatasetRef:
        return collect_dataset(cfg, BROADCAST, target, ctx.ray_address)

    def intact(r: DatasetRef) -> bool:
        # Verified against its checksums, as training will open it: a dataset that fails them
        # (or has none: an older robo-pipe's) is collected again, which rebuilds it from its
        # committed shards.
        return open_dataset(r.path, check_videos=False).content_hash() == r.content_hash

    return run_stage(ctx, "collect", inputs, DatasetRef, run, intact, track)


def _track_training(run: tracking.TrackedRun, r: CheckpointRef) -> None:
    from stages.finetune.checkpoints import read_metrics

    run.log_params(
        {"checkpoint": r.path, "checkpoint_hash": r.content_hash, "trainable": r.trainable}
    )
    run.log_curves(read_metrics(Path(r.path).parent))
    run.log_metrics({"trainable_params": r.trainable_params, "total_params": r.total_params})
    curves = Path(r.path).parent / "learning_curves.png"  # RL fine-tuning draws these
    if curves.is_file():
        run.log_artifact(curves, "plots")


@stage_task("pretrain")
def pretrain_stage(ctx: RunContext) -> CheckpointRef:
    """The base VLA on the task family (every training variant except the target); cached."""
    from stages.policy.checkpoint import CheckpointRef

    cfg = ctx.cfg
    inputs = {
        "config": _sections(cfg, "robot", "scene", "sim", "collect", "policy", "pretrain", "seed")
    }

    def run() -> CheckpointRef:
        base = pretrain_base(cfg, BROADCAST, ctx.ray_address)
        assert base is not None, "the flow pretrains only the default VLA"
        return base

    intact = _path_hash_matches(_checkpoint_hash)
    return run_stage(ctx, "pretrain", inputs, CheckpointRef, run, intact, _track_training)


@stage_task("finetune")
def finetune_stage(
    ctx: RunContext, dataset: DatasetRef, base: CheckpointRef | None
) -> CheckpointRef:
    """LoRA (or full) behaviour cloning of the base on the target task's dataset, then RL in
    simulation when ``finetune.algo`` is ppo, sac or grpo."""
    from stages.policy.checkpoint import CheckpointRef

    cfg = ctx.cfg
    rl = cfg.finetune.is_rl
    sections = ("policy", "finetune", "seed") + (("robot", "scene", "sim") if rl else ())
    inputs = {
        "dataset": dataset.content_hash,
        "base": base.content_hash if base else None,
        "config": _sections(cfg, *sections),
    }

    def run() -> CheckpointRef:
        return finetune_policy(cfg, dataset, base, BROADCAST, ctx.ray_address)

    intact = _path_hash_matches(_checkpoint_hash)
    return run_stage(ctx, "finetune", inputs, CheckpointRef, run, intact, _track_training)


@stage_task("export")
def export_stage(ctx: RunContext, checkpoint: CheckpointRef, dataset: DatasetRef) -> ExportRef:
    """ONNX export with parity checked on random inputs and dataset frames, and its precision
    variants (``export.variants``) calibrated and scored on the dataset."""
    from deploy_edge.bundle.layout import IO_SPEC_FILE
    from stages.export import ExportRef, onnx_hash

    name = f"{Path(checkpoint.path).parent.name}-{checkpoint.content_hash[:12]}"
    target = home_dir("exports") / name
    inputs = {
        "checkpoint": checkpoint.content_hash,
        "dataset": dataset.content_hash,
        "seed": ctx.cfg.seed,
        "export": _sections(ctx.cfg, "export")["export"],  # which variants, how scored
    }

    def run() -> ExportRef:
        return export_checkpoint(
            ctx.cfg, Path(checkpoint.path), target, Path(dataset.path), BROADCAST
        )

    def intact(r: ExportRef) -> bool:
        return Path(r.path).exists() and onnx_hash(Path(r.path)) == r.onnx_hash

    def track(run: tracking.TrackedRun, r: ExportRef) -> None:
        run.log_params({"onnx_hash": r.onnx_hash, "opset": r.opset, "parameters": r.parameters})
        metrics = {f"parity_{k}": v for k, v in r.parity.items()}
        metrics |= {"export_seconds": r.export_seconds, "export_peak_rss_mb": r.export_peak_rss_mb}
        for v in r.variants:
            metrics |= {
                f"{v.name}_relative_error": v.relative_error,
                f"{v.name}_action_error": v.action_error,
                f"{v.name}_candidate": float(v.candidate),
            }
        run.log_metrics(metrics)
        run.log_artifact(Path(r.path) / IO_SPEC_FILE)

    return run_stage(ctx, "export", inputs, ExportRef, run, intact, track)


@stage_task("evaluate")
def evaluate_stage(
    ctx: RunContext, export: ExportRef, base: CheckpointRef | None, checkpoint: CheckpointRef
) -> Evaluation:
    """The exported policy on the held-out suite through ONNX Runtime, on the same seeds as the
    current champion (the regression gate), as the model fine-tuning started from and, after
    RL from a BC warm start, as that warm start (``checkpoint`` is the fine-tune)."""
    cfg = ctx.cfg
    champion = champion_to_beat(cfg.model_name, export.onnx_hash)
    rl_after_bc = cfg.finetune.is_rl and cfg.finetune.warm_start == "bc"
    warm_start = Path(checkpoint.start_checkpoint) if rl_after_bc else None
    inputs = {
        "export": export.onnx_hash,
        "champion": champion.tags.get(ONNX_HASH_TAG, champion.version) if champion else None,
        "start": base.content_hash if base else None,
        "warm_start": str(warm_start) if warm_start else None,
        # export: whether (and how) its variants' success is played against it
        "config": _sections(cfg, "robot", "scene", "sim", "evaluate", "seed", "export"),
    }

    def run() -> Evaluation:
        out = ctx.run_dir / "evaluate"
        return evaluate_candidate(
            cfg, export, base, champion, out, BROADCAST, ctx.ray_address, warm_start
        )

    def track(run: tracking.TrackedRun, r: Evaluation) -> None:
        c = r.candidate
        metrics = {
            "success_rate": c.success_rate,
            "success_ci95_low": c.ci95[0],
            "success_ci95_high": c.ci95[1],
            "env_steps_per_s": c.env_steps_per_s,
            "episodes_per_s": c.episodes_per_s,
        }
        metrics.update({f"success_rate.{row.variant}": row.success_rate for row in c.rows})
        if r.start:
            metrics["start_success_rate"] = r.start.success_rate
        if r.warm_start:
            metrics["warm_start_success_rate"] = r.warm_start.success_rate
        if c.comparison:
            metrics["champion_success_rate"] = c.comparison.baseline_success_rate
            metrics["champion_p_value"] = c.comparison.p_value
            metrics["champion_discordant_candidate_only"] = c.comparison.discordant[
                "candidate_only"
            ]
            metrics["champion_discordant_baseline_only"] = c.comparison.discordant["baseline_only"]
            metrics["comparison_seeds_per_variant"] = c.comparison.seeds
            metrics["comparison_detectable_regression"] = c.comparison.detectable_regression
        run.log_metrics(metrics)
        for report in filter(None, (c, r.start, r.warm_start)):
            folder = Path(report.report).parent
            run.log_artifact(folder, folder.name)

    def intact(r: Evaluation) -> bool:
        return Path(r.candidate.report).is_file()

    return run_stage(ctx, "evaluate", inputs, Evaluation, run, intact, track)


@stage_task("latency")
def latency_stage(ctx: RunContext, export: ExportRef, evaluation: Evaluation) -> LatencyReport:
    """The latency gate: the export in the control loop on this machine, p99 vs the budget;
    then the candidate played at the delay that p99 means on the target, against itself at
    zero delay and the champion (``evaluation``'s) at that delay."""
    from deploy_edge.latency_report import LatencyReport
    from deploy_edge.targets import load_target

    cfg = ctx.cfg
    inputs = {
        "export": export.onnx_hash,
        "profile": load_target(cfg.latency.target).model_dump(),
        "config": _sections(cfg, "robot", "scene", "latency", "seed"),
        "host": socket.gethostname(),
        # the delayed play: the evaluation suite, its zero-delay outcomes, the champion's bar
        "evaluation": evaluation.to_json(),
        "played": _sections(cfg, "evaluate", "sim", "registry"),
    }

    def run() -> LatencyReport:
        out = ctx.run_dir / "latency"
        report = measure_latency(cfg, Path(export.path), out, BROADCAST)
        play_at_device_delay(
            cfg, Path(export.path), report, evaluation, out, BROADCAST, ctx.ray_address
        )
        if cfg.latency.sweep:  # beside the report: the summary and MLflow find it there
            p99 = report.inference_ms
            sweep_delays(
                cfg, Path(export.path), out, p99, BROADCAST, ctx.ray_address,
                name=f"{cfg.name} export", stage="latency",
            )  # fmt: skip
        return report

    def track(run: tracking.TrackedRun, r: LatencyReport) -> None:
        figures = ("p50_ms", "p95_ms", "p99_ms", "max_ms", "mean_ms", "jitter_ms", "misses")
        metrics = {f"latency_{k}": float(getattr(r, k)) for k in (*figures, "budget_ms")}
        run.log_metrics(metrics | {"latency_passed": float(r.passed)})
        at = read_at_delay(Path(r.report).parent)
        if at is not None and at.success_rate is not None:
            run.log_metrics({"at_delay_ticks": at.ticks, "at_delay_success": at.success_rate})
        run.log_params(
            {"target": r.target, **{f"measured_on.{k}": v for k, v in r.measured_on.items()}}
        )
        run.log_artifact(Path(r.report).parent, "latency")

    def intact(r: LatencyReport) -> bool:
        swept = Path(r.report).with_name("delay_sweep.json")
        played = Path(r.report).with_name(AT_DELAY_FILE).is_file()
        return Path(r.report).is_file() and played and (swept.is_file() or not cfg.latency.sweep)

    return run_stage(ctx, "latency", inputs, LatencyReport, run, intact, track)


@stage_task("register")
def register_stage(
    ctx: RunContext,
    dataset: DatasetRef,
    checkpoint: CheckpointRef,
    export: ExportRef,
    evaluation: Evaluation,
    latency: LatencyReport,
) -> Registration:
    """Register the export as a new model version (alias ``candidate``) with its lineage and
    gate results; move ``champion`` to it only if every enforced gate passed."""
    cfg = ctx.cfg
    inputs = {
        "model": cfg.model_name,
        "export": export.onnx_hash,
        "evaluation": evaluation.to_json(),
        "latency": latency.to_json(),
        "promotion": cfg.registry.promotion.model_dump(),
    }

    def run() -> Registration:
        mlrun = tracking.TrackedRun(ctx.mlflow_run_id, "")
        return register_version(
            cfg, dataset, checkpoint, export, evaluation, latency, mlrun, ctx.code, BROADCAST
        )

    def intact(r: Registration) -> bool:
        tags = get_version(r.name, r.version).tags
        return tags.get(ONNX_HASH_TAG) == export.onnx_hash

    def track(run: tracking.TrackedRun, r: Registration) -> None:
        run.set_tags({"model_version": f"{r.name}/{r.version}", "promoted": r.promoted})
        run.log_metrics({f"gate_passed.{name}": float(g.passed) for name, g in r.gates.items()})

    return run_stage(ctx, "register", inputs, Registration, run, intact, track)


@stage_task("deploy")
def deploy_stage(ctx: RunContext, registration: Registration) -> EdgeDeployment:
    """The new champion onto the local edge agent (signed, verified, gated, activated and
    health-checked on the device), then one episode on it."""
    from pipelines.deploy.local_agent import agent_dir, deploy_to_local_agent

    cfg = ctx.cfg
    inputs = {
        "version": f"{registration.name}/{registration.version}",
        "source": registration.source,
        "config": _sections(cfg, "latency", "deploy"),
        "agent": str(agent_dir()),
    }

    def run() -> EdgeDeployment:
        return deploy_to_local_agent(cfg, registration, BROADCAST)

    def intact(r: EdgeDeployment) -> bool:  # the agent still runs that version
        active = Path(r.state_dir) / "active"
        return r.state == "active" and active.exists()

    def track(run: tracking.TrackedRun, r: EdgeDeployment) -> None:
        run.set_tags({"device": r.device, "device_state": r.state})
        figures = {"device_p99_ms": r.p99_ms, "episode_p99_ms": r.episode_p99_ms}
        run.log_metrics({k: v for k, v in figures.items() if v is not None})

    return run_stage(ctx, "deploy", inputs, EdgeDeployment, run, intact, track)
