"""The pipeline's stages as Prefect tasks: each wraps a stage's plain function, reuses the
record of an earlier run when its inputs are unchanged (:mod:`pipelines.resume`), logs to a
nested MLflow run, and reports progress to a listener in this process (``robo-pipe run``).

Every task takes the :class:`RunContext` and upstream records (small JSON dicts: paths,
hashes, figures) and returns its own record.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ParamSpec, Protocol, TypeVar

from prefect import Task, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines import promotion, tracking
from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.resume import Record, StageRecords, stage_key

P = ParamSpec("P")
R = TypeVar("R")

STAGES = ("collect", "pretrain", "finetune", "export", "evaluate", "latency", "register")
"""The pipeline's stages, in order."""

# -- live progress (the CLI listens; Prefect and MLflow see the stage records) -------------------


class Listener(Protocol):
    """Receives stage progress from the flow running in this process (``robo-pipe run``)."""

    def started(self, stage: str, total: float | None, unit: str) -> None:
        """``stage`` began; ``total`` units of work (None: unknown)."""

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        """``completed`` units done; ``detail`` is a short status (loss, success so far)."""

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        """``stage`` completed (``reused``: its record came from an earlier run)."""


_listeners: list[Listener] = []


@contextmanager
def listening(listener: Listener) -> Iterator[None]:
    """Send this process's stage progress to ``listener`` while inside the block."""
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def _started(stage: str, total: float | None, unit: str) -> None:
    for listener in _listeners:
        listener.started(stage, total, unit)


def _advanced(stage: str, completed: float, detail: str = "") -> None:
    for listener in _listeners:
        listener.advanced(stage, completed, detail)


# -- the stage wrapper ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunContext:
    """What every stage task of one flow run shares."""

    cfg: PipelineConfig
    run_dir: Path
    mlflow_run_id: str
    ray_address: str | None
    code: str


def _transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry only errors that may pass: lost connections, timeouts, dead Ray workers."""
    error = state.result(raise_on_failure=False)
    if isinstance(error, ConnectionError | TimeoutError):
        return True
    return type(error).__module__.startswith("ray.") and type(error).__name__ in (
        "RayActorError",
        "ActorDiedError",
        "WorkerCrashedError",
        "ObjectLostError",
        "OwnerDiedError",
        "NodeDiedError",
    )


def stage_task(name: str) -> Callable[[Callable[P, R]], Task[P, R]]:
    """The Prefect task options every stage shares."""
    return task(
        name=name,
        cache_policy=NO_CACHE,  # resume is ours: keyed on inputs, checked against the artifacts
        retries=2,
        retry_delay_seconds=5,
        retry_condition_fn=_transient,
        persist_result=False,
    )


def _run_stage(
    ctx: RunContext,
    stage: str,
    inputs: dict[str, Any],
    run: Callable[[], Record],
    intact: Callable[[Record], bool],
    track: Callable[[tracking.TrackedRun, Record], None],
) -> Record:
    """Reuse ``stage``'s record for ``inputs`` if an earlier run completed it and its artifact
    is ``intact``; else ``run`` it and store the record. Either way log it to a nested MLflow
    run with ``track``. A stage that raises stores nothing."""
    logger = get_run_logger()
    key = stage_key(stage, {**inputs, "code": ctx.code})
    records = StageRecords(home_dir("stages"))
    mlrun = tracking.TrackedRun.start(
        ctx.cfg.name, stage, ctx.mlflow_run_id, {tracking.TAG + "stage": stage}
    )
    start = time.perf_counter()
    try:
        record = records.get(stage, key, intact)
        reused = record is not None
        if record is None:
            record = run()
            records.put(stage, key, record)
        else:
            logger.info(
                "%s: reusing the record of an earlier run (%s)", stage, records.path(stage, key)
            )
        seconds = time.perf_counter() - start
        track(mlrun, record)
        mlrun.set_tags({tracking.TAG + "reused": reused, tracking.TAG + "stage_key": key})
        mlrun.log_metrics({"stage_seconds": seconds})
    except BaseException:
        mlrun.finish("FAILED")
        raise
    mlrun.finish()
    record = {**record, "_stage": {"seconds": seconds, "reused": reused}}
    for listener in _listeners:
        listener.finished(stage, _describe(stage, record), reused)
    return record


def _describe(stage: str, record: Record) -> str:
    """One line for the progress display."""
    if stage == "collect":
        return f"{record['episodes']} episodes, {record['frames']} frames"
    if stage in ("pretrain", "finetune"):
        return f"step {record['step']}, loss {record['metrics'].get('action_loss', 0):.4f}"
    if stage == "export":
        return f"parity {record['parity_max_abs_error']:.1e}"
    if stage == "evaluate":
        c = record["candidate"]
        return f"success {c['success_rate']:.1%} ({c['ci95'][0]:.1%} - {c['ci95'][1]:.1%})"
    if stage == "latency":
        return f"p99 {record['p99_ms']:.2f} ms ({'pass' if record['passed'] else 'FAIL'})"
    if stage == "register":
        return f"v{record['version']} {', '.join(record['aliases'])}"
    return ""


def _hash_matches(
    path_key: str, hash_key: str, hasher: Callable[[Path], str]
) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        return (
            Path(record[path_key]).exists() and hasher(Path(record[path_key])) == record[hash_key]
        )

    return check


def _files_exist(*keys: str) -> Callable[[Record], bool]:
    def check(record: Record) -> bool:
        return all(Path(_dig(record, k)).is_file() for k in keys)

    return check


def _dig(record: Record, dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        value = value[part]
    return value


def _checkpoint_hash(path: Path) -> str:
    from stages.policy.checkpoint import checkpoint_hash

    return checkpoint_hash(path)


# -- the stages ----------------------------------------------------------------------------------


@stage_task("collect")
def collect_stage(ctx: RunContext) -> Record:
    """Demonstrations of the target task into a LeRobot v3 dataset (resumable)."""
    from stages.collect import collect
    from stages.dataset.layout import content_hash

    cfg = ctx.cfg
    target = home_dir("datasets") / cfg.dataset_name()
    inputs = {
        "config": cfg.model_dump(include={"robot", "scene", "sim", "collect", "seed"}, mode="json"),
        "path": str(target),
    }

    def run() -> Record:
        _started("collect", cfg.collect.episodes, "episodes")
        done = 0

        def on_shard(result: Any) -> None:
            nonlocal done
            done += result.attempted
            _advanced(
                "collect", done, f"source success {result.solved / max(1, result.attempted):.0%}"
            )

        ref = collect(
            cfg.robot,
            cfg.scene,
            cfg.sim,
            cfg.collect,
            cfg.seed,
            target,
            ctx.ray_address,
            on_shard=on_shard,
            extra_provenance={"config_hash": cfg.config_hash()},
        )
        return ref.to_json()

    def track(run: tracking.TrackedRun, r: Record) -> None:
        run.log_params({"dataset": r["path"], "dataset_hash": r["content_hash"]})
        run.log_metrics(
            {
                "episodes": r["episodes"],
                "frames": r["frames"],
                "source_success_rate": r["source_success_rate"],
            }
        )

    return _run_stage(
        ctx, "collect", inputs, run, _hash_matches("path", "content_hash", content_hash), track
    )


def _train_tracker(stage: str, total: int) -> Callable[[dict[str, float]], None]:
    _started(stage, total, "steps")

    def on_metrics(record: dict[str, float]) -> None:
        _advanced(
            stage,
            record["step"],
            f"loss {record['action_loss']:.4f}, {record['samples_per_s']:,.0f} samples/s",
        )

    return on_metrics


def _track_training(run: tracking.TrackedRun, r: Record) -> None:
    from stages.finetune.bc import read_metrics

    run.log_params(
        {"checkpoint": r["path"], "checkpoint_hash": r["content_hash"], "trainable": r["trainable"]}
    )
    run.log_curves(read_metrics(Path(r["path"]).parent))
    run.log_metrics({"trainable_params": r["trainable_params"], "total_params": r["total_params"]})
    curves = Path(r["path"]).parent / "learning_curves.png"  # RL fine-tuning draws these
    if curves.is_file():
        run.log_artifact(curves, "plots")


@stage_task("pretrain")
def pretrain_stage(ctx: RunContext) -> Record:
    """The base VLA on the task family (every training variant except the target); cached."""
    from pipelines.training import pretrain_base

    cfg = ctx.cfg
    inputs = {
        "config": cfg.model_dump(
            include={"robot", "scene", "sim", "collect", "policy", "pretrain", "seed"}, mode="json"
        )
    }

    def run() -> Record:
        ref = pretrain_base(
            cfg,
            ctx.ray_address,
            on_metrics=_train_tracker("pretrain", cfg.pretrain.bc.steps),
            on_status=lambda line: _advanced("pretrain", 0, line),
        )
        return ref.to_json()

    return _run_stage(
        ctx,
        "pretrain",
        inputs,
        run,
        _hash_matches("path", "content_hash", _checkpoint_hash),
        _track_training,
    )


@stage_task("finetune")
def finetune_stage(ctx: RunContext, dataset: Record, base: Record | None) -> Record:
    """LoRA (or full) behaviour cloning of the base on the target task's dataset, then RL in
    simulation when ``finetune.algo`` is ppo or sac."""
    from pipelines.training import bc_finetune, rl_finetune_from
    from stages.policy.checkpoint import CheckpointRef

    cfg = ctx.cfg
    rl = cfg.finetune.algo in ("ppo", "sac")
    sections = {"policy", "finetune", "seed"} | ({"robot", "scene", "sim"} if rl else set())
    inputs = {
        "dataset": dataset["content_hash"],
        "base": base["content_hash"] if base else None,
        "config": cfg.model_dump(include=sections, mode="json"),
    }

    def run() -> Record:
        base_ref = None
        if base:
            base_ref = CheckpointRef(**{k: v for k, v in base.items() if not k.startswith("_")})
        if rl and cfg.finetune.warm_start == "none":
            if base_ref is None:
                raise ValueError("finetune.warm_start: none needs the default VLA's base")
            ref = base_ref
        else:
            ref = bc_finetune(
                cfg,
                dataset["path"],
                base_ref,
                ctx.ray_address,
                _train_tracker("finetune", cfg.finetune.bc.steps),
            )
        if rl:
            tracker = _rl_tracker(cfg.finetune.algo, cfg.finetune.rl.iterations)
            ref = rl_finetune_from(cfg, ref, ctx.ray_address, tracker)
        return ref.to_json()

    return _run_stage(
        ctx,
        "finetune",
        inputs,
        run,
        _hash_matches("path", "content_hash", _checkpoint_hash),
        _track_training,
    )


def _rl_tracker(algo: str, iterations: int) -> Callable[[dict[str, float]], None]:
    _started("finetune", iterations, f"{algo} iterations")

    def on_metrics(record: dict[str, float]) -> None:
        success = record.get("success_rate", float("nan"))
        shown = "-" if success != success else f"{success:.0%}"
        _advanced(
            "finetune",
            record["step"],
            f"{algo}: training success {shown}, {record['env_steps_per_s']:,.0f} env-steps/s",
        )

    return on_metrics


@stage_task("export")
def export_stage(ctx: RunContext, checkpoint: Record, dataset: Record) -> Record:
    """ONNX export with parity checked on random inputs and dataset frames."""
    from robots.spec import get_robot
    from stages.export.onnx import export_policy, onnx_hash

    cfg = ctx.cfg
    target = (
        home_dir("exports")
        / f"{Path(checkpoint['path']).parent.name}-{checkpoint['content_hash'][:12]}"
    )
    control_hz = get_robot(cfg.robot).control_hz
    inputs = {
        "checkpoint": checkpoint["content_hash"],
        "dataset": dataset["content_hash"],
        "seed": cfg.seed,
    }

    def run() -> Record:
        _started("export", None, "")
        ref = export_policy(
            checkpoint["path"], target, control_hz, cfg.seed, dataset=dataset["path"]
        )
        return ref.to_json()

    def track(run: tracking.TrackedRun, r: Record) -> None:
        run.log_params({"onnx_hash": r["onnx_hash"], "opset": r["opset"]})
        run.log_metrics({f"parity_{k}": v for k, v in r["parity"].items()})
        run.log_artifact(Path(r["path"]) / "io_spec.json")

    return _run_stage(
        ctx, "export", inputs, run, _hash_matches("path", "onnx_hash", onnx_hash), track
    )


def compact(report: Any) -> Record:
    """An evaluation report without its per-episode lists (records stay small)."""
    record: Record = report.to_json()
    for bulky in ("outcomes", "seeds"):
        record.pop(bulky, None)
    return record


@stage_task("evaluate")
def evaluate_stage(ctx: RunContext, export: Record, base: Record | None) -> Record:
    """The exported policy on the held-out suite through ONNX Runtime, on the same seeds as the
    current champion (the regression gate) and as the model fine-tuning started from."""
    from stages.evaluate.run import ShardOutcome, suite_variants
    from stages.evaluate.stage import evaluate

    cfg = ctx.cfg
    current = tracking.champion(cfg.model_name)
    champion_version = current.version if current else None
    if current and current.tags.get(tracking.TAG + "onnx_hash") == export["onnx_hash"]:
        current = None  # this very export is already the champion: nothing to compare with
    inputs = {
        "export": export["onnx_hash"],
        "champion": current.tags.get(tracking.TAG + "onnx_hash", current.version)
        if current
        else None,
        "start": base["content_hash"] if base else None,
        "config": cfg.model_dump(
            include={"robot", "scene", "sim", "evaluate", "seed"}, mode="json"
        ),
    }

    def run() -> Record:
        baseline = tracking.fetch_export(cfg.model_name, current.version)[1] if current else None
        policies = 1 + (baseline is not None) + (base is not None)
        per_policy = len(suite_variants(cfg.scene, cfg.evaluate)) * cfg.evaluate.episodes
        _started("evaluate", policies * per_policy, "episodes")
        done = wins = 0

        def on_shard(outcome: ShardOutcome) -> None:
            nonlocal done, wins
            done += len(outcome.episodes)
            wins += sum(e.success for e in outcome.episodes)
            _advanced("evaluate", done, f"success so far {wins / max(1, done):.0%}")

        def run_suite(policy: str | Path, out: Path, against: Path | None) -> Record:
            return compact(
                evaluate(
                    policy,
                    cfg.robot,
                    cfg.scene,
                    cfg.sim,
                    cfg.evaluate,
                    cfg.seed,
                    out,
                    baseline=against,
                    ray_address=ctx.ray_address,
                    on_shard=on_shard,
                )
            )

        record: Record = {
            "candidate": run_suite(export["path"], ctx.run_dir / "evaluate", baseline)
        }
        record["champion_version"] = champion_version
        record["start"] = (
            run_suite(base["path"], ctx.run_dir / "evaluate-start", None) if base else None
        )
        return record

    def track(run: tracking.TrackedRun, r: Record) -> None:
        c = r["candidate"]
        metrics = {
            "success_rate": c["success_rate"],
            "success_ci95_low": c["ci95"][0],
            "success_ci95_high": c["ci95"][1],
            "env_steps_per_s": c["env_steps_per_s"],
            "episodes_per_s": c["episodes_per_s"],
        }
        metrics.update({f"success_rate.{row['variant']}": row["success_rate"] for row in c["rows"]})
        if r["start"]:
            metrics["start_success_rate"] = r["start"]["success_rate"]
        if c.get("comparison"):
            metrics["champion_success_rate"] = c["comparison"]["baseline_success_rate"]
            metrics["champion_p_value"] = c["comparison"]["p_value"]
        run.log_metrics(metrics)
        for report in filter(None, (c, r["start"])):
            folder = Path(report["report"]).parent
            run.log_artifact(folder, folder.name)

    return _run_stage(ctx, "evaluate", inputs, run, _files_exist("candidate.report"), track)


@stage_task("latency")
def latency_stage(ctx: RunContext, export: Record) -> Record:
    """The latency gate: the export in the control loop on this machine, p99 vs the budget."""
    from deploy_edge.latency import load_target, run_gate
    from pipelines.gate import gate_robot

    cfg, gate = ctx.cfg, ctx.cfg.latency
    profile = load_target(gate.target)  # a bad target fails before any measuring
    inputs = {
        "export": export["onnx_hash"],
        "profile": profile.model_dump(),
        "config": cfg.model_dump(include={"robot", "scene", "latency", "seed"}, mode="json"),
        "host": socket.gethostname(),
    }

    def run() -> Record:
        _started("latency", None, "")
        robot, instruction = gate_robot(cfg, export["path"])
        out = ctx.run_dir / "latency"
        out.mkdir(parents=True, exist_ok=True)
        report = run_gate(
            export["path"],
            robot,
            instruction,
            profile,
            gate.steps,
            gate.warmup,
            gate.budget_ms,
            gate.pace,
            out,
        )
        return report.to_json()

    def track(run: tracking.TrackedRun, r: Record) -> None:
        keys = (
            "p50_ms",
            "p95_ms",
            "p99_ms",
            "max_ms",
            "mean_ms",
            "jitter_ms",
            "misses",
            "budget_ms",
        )
        run.log_metrics(
            {f"latency_{k}": float(r[k]) for k in keys} | {"latency_passed": float(r["passed"])}
        )
        run.log_params(
            {"target": r["target"], **{f"measured_on.{k}": v for k, v in r["measured_on"].items()}}
        )
        run.log_artifact(Path(r["report"]).parent, "latency")

    return _run_stage(ctx, "latency", inputs, run, _files_exist("report"), track)


@stage_task("register")
def register_stage(
    ctx: RunContext,
    dataset: Record,
    ckpt: Record,
    export: Record,
    evaluation: Record,
    latency: Record,
) -> Record:
    """Register the export as a new model version (alias ``candidate``) with its lineage and
    gate results; move ``champion`` to it only if every enforced gate passed."""
    cfg = ctx.cfg
    gates = promotion.promotion_gates(cfg, evaluation, latency)
    inputs = {
        "model": cfg.model_name,
        "export": export["onnx_hash"],
        "gates": gates,
        "promotion": cfg.registry.promotion.model_dump(),
    }

    def run() -> Record:
        _started("register", None, "")
        cand = evaluation["candidate"]
        tags = {
            tracking.TAG + "dataset_hash": dataset["content_hash"],
            tracking.TAG + "base_model": (ckpt.get("base") or {}).get("path", ""),
            tracking.TAG + "base_hash": (ckpt.get("base") or {}).get("hash", ""),
            tracking.TAG + "checkpoint_hash": ckpt["content_hash"],
            tracking.TAG + "onnx_hash": export["onnx_hash"],
            tracking.TAG + "config_hash": cfg.config_hash(),
            tracking.TAG + "code_version": ctx.code,
            tracking.TAG + "success_rate": f"{cand['success_rate']:.4f}",
            tracking.TAG + "latency_p99_ms": f"{latency['p99_ms']:.3f}",
        }
        for name, g in gates.items():  # the verdict, and what it was decided on
            tags[tracking.GATE_TAG + name] = "passed" if g["passed"] else "failed"
            tags[f"{tracking.GATE_TAG}{name}.measured"] = g["measured"]
            tags[f"{tracking.GATE_TAG}{name}.required"] = g["required"]
        same = tracking.find_export(cfg.model_name, export["onnx_hash"])
        if same is None:
            run = tracking.TrackedRun(ctx.mlflow_run_id, "")
            info = tracking.register_export(Path(export["path"]), cfg.model_name, run, tags)
        else:  # this export is registered already: one version per export, tags refreshed
            tracking.set_version_tags(cfg.model_name, same.version, tags)
            info = tracking.set_alias(cfg.model_name, tracking.CANDIDATE, same.version)
        blocking = promotion.blocking_gates(gates)
        if not blocking and tracking.CHAMPION not in info.aliases:
            info = tracking.promote(
                cfg.model_name, info.version, f"pipeline run {ctx.run_dir.name}: all gates passed"
            )
        return {
            "name": info.name,
            "version": info.version,
            "aliases": info.aliases,
            "promoted": not blocking,
            "blocked_by": blocking,
            "gates": gates,
            "source": info.source,
        }

    def intact(r: Record) -> bool:
        return (
            tracking.get_version(r["name"], r["version"]).tags.get(tracking.TAG + "onnx_hash")
            == export["onnx_hash"]
        )

    def track(run: tracking.TrackedRun, r: Record) -> None:
        run.set_tags({"model_version": f"{r['name']}/{r['version']}", "promoted": r["promoted"]})
        run.log_metrics(
            {f"gate_passed.{name}": float(g["passed"]) for name, g in r["gates"].items()}
        )

    return _run_stage(ctx, "register", inputs, run, intact, track)
