"""The pipeline's steps: each stage called with a pipeline config. The one wiring layer.

Every step maps the config's sections to a stage's arguments, puts its output under
``$ROBO_PIPE_HOME``, reports progress to a :class:`~pipelines.progress.Listener` and returns
the stage's typed record. The CLI verbs and the Prefect tasks both call these and hold no
stage logic of their own::

    collect_dataset(cfg) -> DatasetRef
    pretrain_base(cfg) -> CheckpointRef | None            (the default VLA's base; cached)
    finetune_policy(cfg, dataset, base) -> CheckpointRef  (BC, then PPO/SAC/GRPO if configured)
    export_checkpoint(cfg, checkpoint, out) -> ExportRef
    evaluate_policy(cfg, policy, out) -> EvalReport        (one suite, optional baseline)
    evaluate_candidate(cfg, export, base, champion, out) -> Evaluation  (the pipeline's)
    measure_latency(cfg, export, out) -> LatencyReport
    register_version(cfg, lineage..., evaluation, latency, run) -> Registration
    evaluate_champion(cfg, out) -> ChampionCheck

The checks of a command's inputs before any work starts are :mod:`pipelines.checks`. The stage
packages (and torch) are imported when a step runs, not when this module is imported.
"""

from __future__ import annotations

import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.progress import SILENT, Listener, rl_detail, status_lines, training_detail
from pipelines.records import ChampionCheck, Evaluation, Registration
from pipelines.registry.champion import (
    candidate_outcomes,
    comparison_tags,
    decide_gates,
    outcome_tags,
    recheck,
    regression_check,
    same_export_champion,
    store_outcomes,
    stored_outcomes,
)
from pipelines.registry.exports import fetch_export, register_export
from pipelines.registry.promotion import promote, promotion_lock
from pipelines.registry.tags import (
    BASE_HASH_TAG,
    BASE_MODEL_TAG,
    CHECKPOINT_HASH_TAG,
    CODE_VERSION_TAG,
    CONFIG_HASH_TAG,
    DATASET_HASH_TAG,
    LATENCY_P99_TAG,
    ONNX_HASH_TAG,
    SUCCESS_RATE_TAG,
)
from pipelines.registry.versions import (
    CANDIDATE,
    CHAMPION,
    VersionInfo,
    find_export,
    set_alias,
    set_version_tags,
)
from robo_pipe.errors import InputError
from robo_pipe.locks import output_lock
from stages.policy.types import policy_type
from stages.register import blocking_gates, gate_tags

if TYPE_CHECKING:
    from deploy_edge.bundle.io_spec import Variant
    from deploy_edge.latency_report import LatencyReport
    from pipelines.tracking import TrackedRun
    from stages.dataset.layout import DatasetRef
    from stages.evaluate.report import EvalReport
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef


# -- the steps -----------------------------------------------------------------------------------


def default_dataset(cfg: PipelineConfig) -> Path:
    """Where ``cfg``'s dataset is collected: ``$ROBO_PIPE_HOME/datasets/<dataset_name>``."""
    return home_dir("datasets") / cfg.dataset_name()


def collect_dataset(
    cfg: PipelineConfig,
    listener: Listener = SILENT,
    out: Path | None = None,
    ray_address: str | None = None,
) -> DatasetRef:
    """Collect (or finish, or reuse) ``cfg``'s demonstrations into a LeRobot v3 dataset at
    ``out`` (default :func:`default_dataset`); its provenance records the resolved config."""
    from stages.collect import ShardResult, collect

    listener.started("collect", cfg.collect.episodes, "episodes")
    start = time.perf_counter()
    done = solved = frames = 0

    def on_shard(result: ShardResult) -> None:
        nonlocal done, solved, frames
        done, solved = done + result.attempted, solved + result.solved
        frames += result.kept_frames
        rate = frames / (time.perf_counter() - start)
        listener.advanced(
            "collect", done, f"source success {solved / done:.0%}, {rate:,.0f} frames/s"
        )

    return collect(
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.collect,
        cfg.seed,
        out or default_dataset(cfg),
        ray_address,
        on_shard=on_shard,
        extra_provenance={"config": cfg.model_dump(mode="json"), "config_hash": cfg.config_hash()},
        on_status=status_lines("collect", listener),
    )


def pretrain_base(
    cfg: PipelineConfig, listener: Listener = SILENT, ray_address: str | None = None
) -> CheckpointRef | None:
    """The default VLA's base for ``cfg`` (pretrained once, then cached); None for a hub-vlm
    policy, which starts from its pretrained backbone."""
    if not policy_type(cfg.policy.type).needs_pretraining:
        return None
    from stages.finetune import pretrain

    listener.started("pretrain", cfg.pretrain.bc.steps, "steps")
    return pretrain(
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.collect,
        cfg.policy,
        cfg.pretrain,
        cfg.seed,
        home_dir("checkpoints"),
        home_dir("datasets"),
        ray_address,
        on_metrics=lambda m: listener.advanced("pretrain", m["step"], training_detail(m)),
        on_status=status_lines("pretrain", listener),
    )


def needs_dataset(cfg: PipelineConfig) -> bool:
    """Whether fine-tuning reads demonstrations (not for RL from the base's fresh adapters)."""
    return not (cfg.finetune.is_rl and cfg.finetune.warm_start == "none")


def finetune_policy(
    cfg: PipelineConfig,
    dataset: DatasetRef | Path | None,
    base: CheckpointRef | None,
    listener: Listener = SILENT,
    ray_address: str | None = None,
) -> CheckpointRef:
    """Fine-tune as ``cfg.finetune`` says: behaviour cloning of ``base`` (or of a hub-vlm
    backbone) on ``dataset``, then RL in simulation when ``algo`` is ppo, sac or grpo; with
    ``warm_start: none`` RL starts from ``base`` with fresh adapters and ``dataset`` is unused.
    Each part is cached and resumable."""
    from stages.finetune import finetune

    if needs_dataset(cfg):
        if dataset is None:
            raise InputError("finetune: behaviour cloning needs a dataset")
        listener.started("finetune", cfg.finetune.bc.steps, "BC steps")
        start = finetune(
            dataset,
            cfg.policy,
            cfg.finetune,
            base,
            cfg.seed,
            home_dir("checkpoints"),
            name=cfg.slug,
            ray_address=ray_address,
            on_metrics=lambda m: listener.advanced("finetune", m["step"], training_detail(m)),
            lineage={"config_hash": cfg.config_hash()},
            on_status=status_lines("finetune", listener),
        )
    elif base is None:  # the config check refuses this; a caller passing no base is a bug
        raise AssertionError("RL from fresh adapters needs the default VLA's base")
    else:
        start = base
    if not cfg.finetune.is_rl:
        return start
    return rl_finetune_from(cfg, start, listener, ray_address)


def rl_finetune_from(
    cfg: PipelineConfig,
    start: CheckpointRef,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    checkpoints: Path | None = None,
) -> CheckpointRef:
    """PPO, SAC or GRPO (``cfg.finetune.algo``) in simulation from ``start`` (a BC fine-tune, or a
    base with fresh adapters), under ``checkpoints`` (default the home's); cached, resumable."""
    from stages.finetune import rl_finetune

    algo = cfg.finetune.algo
    listener.started("finetune", cfg.finetune.rl.iterations, f"{algo} iterations")
    return rl_finetune(
        start,
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.finetune,
        cfg.seed,
        checkpoints or home_dir("checkpoints"),
        name=cfg.slug,
        ray_address=ray_address,
        on_metrics=lambda m: listener.advanced("finetune", m["step"], rl_detail(algo, m)),
        lineage={"config_hash": cfg.config_hash()},
        lora=cfg.policy.lora,
        on_status=status_lines("finetune", listener),
    )


def export_checkpoint(
    cfg: PipelineConfig,
    checkpoint: Path,
    out: Path,
    dataset: Path | None = None,
    listener: Listener = SILENT,
) -> ExportRef:
    """Export ``checkpoint`` to an ONNX bundle at ``out`` (parity checked on random inputs and,
    with ``dataset``, on its frames), at ``cfg``'s robot's control rate, with the precision
    variants ``cfg.export`` asks for, calibrated and scored on ``dataset`` (without one: FP32
    only, and the record's ``note`` says so). One exporter per ``out`` at a time: a run that
    waited for another gets that one's export back."""
    from robots.spec import get_robot
    from stages.export import QuantizeError, export

    listener.started("export", None, "")
    with output_lock(out, "export", status_lines("export", listener)):
        try:
            return export(
                checkpoint,
                out,
                get_robot(cfg.robot).control_hz,
                cfg.seed,
                dataset=dataset,
                config=cfg.export,
            )
        except QuantizeError as err:  # a dataset too small to hold frames out: the input's
            raise InputError(str(err)) from err


def evaluate_policy(
    cfg: PipelineConfig,
    policy: Path,
    out: Path,
    listener: Listener = SILENT,
    baseline: Path | None = None,
    ray_address: str | None = None,
    baseline_outcomes: dict[str, str] | None = None,
) -> EvalReport:
    """``policy`` (checkpoint or export) on ``cfg``'s evaluation suite; with ``baseline``, that
    too on the same seeds (except those ``baseline_outcomes``, its stored outcomes, cover),
    gated on the difference. Reports into ``out``."""
    listener.started("evaluate", _suite_episodes(cfg) * (2 if baseline else 1), "episodes")
    return _evaluate(cfg, policy, out, listener, baseline, ray_address, _Tally(), baseline_outcomes)


def evaluate_candidate(
    cfg: PipelineConfig,
    export: ExportRef,
    base: CheckpointRef | None,
    champion: VersionInfo | None,
    out: Path,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    warm_start: Path | None = None,
) -> Evaluation:
    """The pipeline's evaluation: the export on the held-out suite against ``champion``'s
    export on the same seeds (the no-regression gate), and the model fine-tuning started from
    (``base``) and, after RL, the BC fine-tune RL started from (``warm_start``), on the same
    suite. With ``export.score_success``, each candidate precision variant of the export
    plays the same seeds against it too (:func:`score_variant_success`). Per-episode lists are
    dropped from the records."""
    baseline = fetch_export(cfg.model_name, champion.version)[1] if champion else None
    stored = stored_outcomes(cfg, champion) if champion else {}
    starts = {"start": base.path if base else None, "warm-start": warm_start}
    variants = _variants_to_play(cfg, Path(export.path))
    policies = 1 + (baseline is not None) + sum(p is not None for p in starts.values())
    listener.started("evaluate", (policies + len(variants)) * _suite_episodes(cfg), "episodes")
    tally = _Tally()
    candidate = _evaluate(
        cfg, Path(export.path), out, listener, baseline, ray_address, tally, stored
    )
    if champion is not None and candidate.baseline_outcomes:  # kept for the next candidate
        store_outcomes(cfg, champion, stored, candidate.baseline_outcomes)
    if variants:
        score_variant_success(cfg, export, candidate, out, listener, ray_address, tally)
    reports: dict[str, EvalReport | None] = {}
    for name, path in starts.items():
        where = out.with_name(f"{out.name}-{name}")
        reports[name] = (
            _compact(_evaluate(cfg, Path(path), where, listener, None, ray_address, tally))
            if path is not None
            else None
        )
    return Evaluation(
        candidate=_compact(candidate),
        champion_version=champion.version if champion else same_export_champion(cfg, export),
        start=reports["start"],
        warm_start=reports["warm-start"],
    )


def score_variant_success(
    cfg: PipelineConfig,
    export: ExportRef,
    fp32: EvalReport,
    out: Path,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    tally: _Tally | None = None,
) -> list[Variant]:
    """Each precision variant of ``export`` within its error bar on the held-out suite
    against the FP32 export on the same seeds, with the paired test the no-regression gate
    uses (``fp32`` is the FP32 export's report: its outcomes are reused, not played again);
    worse than FP32 makes it no candidate. The figures (``rate``, ``fp32_rate``,
    ``difference``, ``p_value``, ``episodes``) go into each variant's ``success`` and the
    export's spec is rewritten with them (:func:`stages.export.onnx.update_variants`). Nothing
    is played for a random-weights policy (it solves nothing) or without
    ``export.score_success``. Reports into ``<out>-<variant>``; returns the variants."""
    from deploy_edge.bundle.io_spec import read_io_spec
    from stages.evaluate.sequential import encode_outcomes
    from stages.export.onnx import update_variants

    root = Path(export.path)
    spec = read_io_spec(root)
    names = {v.name for v in _variants_to_play(cfg, root)}
    if not names:
        return list(spec.variants)
    fp32_outcomes = encode_outcomes(fp32.successes_by_episode())
    scored: list[Variant] = []
    for v in spec.variants:
        if v.name not in names:
            scored.append(v)
            continue
        where = out.with_name(f"{out.name}-{v.name}")
        report = _evaluate(
            cfg,
            root / v.onnx_file,
            where,
            listener,
            root,
            ray_address,
            tally or _Tally(),
            fp32_outcomes,
        )
        c = report.comparison
        assert c is not None  # played against a baseline
        success = {
            "rate": report.success_rate,
            "fp32_rate": c.baseline_success_rate,
            "difference": c.difference,
            "p_value": c.p_value,
            "episodes": float(c.table.seeds),
        }
        reason = (
            ""
            if c.passed
            else (
                f"held-out success {c.baseline_success_rate + c.difference:.1%} against FP32 "
                f"{c.baseline_success_rate:.1%} on the same {c.table.seeds} episodes: worse by "
                f"the paired test (p {c.p_value:.3g}, {c.reason})"
            )
        )
        scored.append(replace(v, success=success, candidate=c.passed, reason=reason))
    with output_lock(root, "export"):  # the export's own lock: no exporter rewrites it meanwhile
        update_variants(root, tuple(scored))
    return scored


def _variants_to_play(cfg: PipelineConfig, export: Path) -> list[Variant]:
    """The export's variants whose success is to be played: within their error bar, when
    ``export.score_success`` is on and the policy was trained here (not random weights)."""
    from deploy_edge.bundle.io_spec import read_io_spec

    spec = read_io_spec(export)
    if not cfg.export.score_success or spec.random_weights:
        return []
    return [
        v
        for v in spec.variants
        if v.relative_error <= float(v.calibration.get("max_relative_error", float("inf")))
    ]


def measure_latency(
    cfg: PipelineConfig, export: Path, out: Path, listener: Listener = SILENT
) -> LatencyReport:
    """The latency gate (``cfg.latency``): the export in the control loop of ``cfg``'s
    simulated robot on the target profile's engine, p99 against the budget. Reports into
    ``out``. A profile with ``precision: auto`` gates every way its engine can run the bundle
    (the FP32 model and each candidate variant) and reports the choice the device would make
    (:func:`deploy_edge.latency.run_auto_gate`): the most accurate one within the budget."""
    from deploy_edge.bundle.io_spec import read_io_spec
    from deploy_edge.latency import run_auto_gate, run_gate
    from deploy_edge.targets import load_target
    from robots.spec import get_robot
    from sim_scenes.sim_robot import SimulatedRobot

    gate = cfg.latency
    profile = load_target(gate.target)
    spec = read_io_spec(export)

    def robot() -> SimulatedRobot:
        return SimulatedRobot(
            get_robot(cfg.robot),
            cfg.scene.task(),
            seed=cfg.seed,
            cameras=tuple(spec.cameras),
            image_size=spec.image_size,
        )

    first = robot()
    first.connect()  # the gate runs the control loop on its first episode's instruction
    instruction = first.instruction
    first.stop()
    listener.started("latency", None, "")
    listener.advanced("latency", 0, f"measuring {gate.steps} control steps on {profile.name}")
    out.mkdir(parents=True, exist_ok=True)
    if profile.chooser is not None:
        return run_auto_gate(
            export,
            robot,
            instruction,
            profile,
            gate.steps,
            gate.warmup,
            gate.budget_ms,
            gate.pace,
            out,
        )
    return run_gate(
        export, first, instruction, profile, gate.steps, gate.warmup, gate.budget_ms, gate.pace, out
    )


def register_version(
    cfg: PipelineConfig,
    dataset: DatasetRef,
    checkpoint: CheckpointRef,
    export: ExportRef,
    evaluation: Evaluation,
    latency: LatencyReport,
    run: TrackedRun,
    code: str,
    listener: Listener = SILENT,
) -> Registration:
    """Register ``export`` as a version of ``cfg.model_name`` (alias ``candidate``; one version
    per export: a re-registered export gets its tags refreshed) with its lineage and every
    gate's decision; move ``champion`` to it only if no enforced gate failed.

    Promotion is a compare-and-set under the model's
    :func:`~pipelines.registry.promotion.promotion_lock`: the champion is read again there, and
    if another run promoted a version since ``export`` was evaluated, the candidate is compared
    again with that one, on the same seeds (its stored per-seed outcomes when they cover them,
    else a fresh evaluation of its export), and the gates are decided again before the alias
    may move (:func:`pipelines.registry.champion.recheck`). The version is tagged with its own
    per-seed outcomes (for the candidates after it) and the comparison's figures."""
    listener.started("register", None, "")
    candidate, compared_with = evaluation.candidate, evaluation.champion_version
    # The export's spec says whether its weights are random, whatever config registers it.
    gates = decide_gates(cfg, candidate, compared_with, latency, export.random_weights)
    base = checkpoint.base
    tags = {
        DATASET_HASH_TAG: dataset.content_hash,
        BASE_MODEL_TAG: base.path if base else "",
        BASE_HASH_TAG: base.hash if base else "",
        CHECKPOINT_HASH_TAG: checkpoint.content_hash,
        ONNX_HASH_TAG: export.onnx_hash,
        CONFIG_HASH_TAG: cfg.config_hash(),
        CODE_VERSION_TAG: code,
        SUCCESS_RATE_TAG: f"{candidate.success_rate:.4f}",
        LATENCY_P99_TAG: f"{latency.p99_ms:.3f}",
        **gate_tags(gates),
        **comparison_tags(candidate.comparison),
        **outcome_tags(cfg, candidate_outcomes(candidate)),
    }
    with promotion_lock(cfg.model_name):
        same = find_export(cfg.model_name, export.onnx_hash)
        if same is None:
            info = register_export(Path(export.path), cfg.model_name, run, tags)
        else:
            set_version_tags(cfg.model_name, same.version, tags)
            info = set_alias(cfg.model_name, CANDIDATE, same.version)
        evaluate = partial(evaluate_policy, cfg, listener=listener)
        gates = recheck(cfg, info.version, evaluation, gates, latency, evaluate, listener)
        blocking = blocking_gates(gates)
        if not blocking and CHAMPION not in info.aliases:
            reason = f"pipeline run {run.run_id}: all gates passed"
            info = promote(cfg.model_name, info.version, reason)
    return Registration(
        name=info.name,
        version=info.version,
        aliases=info.aliases,
        promoted=not blocking,
        blocked_by=blocking,
        gates=gates,
        source=info.source,
    )


def evaluate_champion(
    cfg: PipelineConfig, out: Path, listener: Listener = SILENT, ray_address: str | None = None
) -> ChampionCheck:
    """The champion of ``cfg.model_name`` on the held-out suite, against
    ``registry.promotion.min_success``; the result is tagged on the version."""
    info, bundle = fetch_export(cfg.model_name, CHAMPION)
    report = evaluate_policy(cfg, bundle, out, listener, ray_address=ray_address)
    return regression_check(cfg, info, _compact(report))


# -- helpers -------------------------------------------------------------------------------------


class _Tally:
    """Episodes and successes over every suite of one evaluate step (for progress)."""

    def __init__(self) -> None:
        self.done = self.wins = self.steps = 0
        self.start = time.perf_counter()


def _suite_episodes(cfg: PipelineConfig) -> int:
    from stages.evaluate import suite_variants

    return len(suite_variants(cfg.scene, cfg.evaluate)) * cfg.evaluate.episodes


def _evaluate(
    cfg: PipelineConfig,
    policy: Path,
    out: Path,
    listener: Listener,
    baseline: Path | None,
    ray_address: str | None,
    tally: _Tally,
    baseline_outcomes: dict[str, str] | None = None,
) -> EvalReport:
    from stages.evaluate import ShardOutcome, evaluate
    from stages.evaluate.sequential import decode_outcomes

    def on_shard(outcome: ShardOutcome) -> None:
        tally.done += len(outcome.episodes)
        tally.wins += sum(e.success for e in outcome.episodes)
        tally.steps += sum(e.length for e in outcome.episodes)
        rate = tally.steps / (time.perf_counter() - tally.start)
        detail = f"success so far {tally.wins / tally.done:.0%}, {rate:,.0f} env-steps/s"
        listener.advanced("evaluate", tally.done, detail)

    return evaluate(
        policy,
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.evaluate,
        cfg.seed,
        out,
        baseline=baseline,
        ray_address=ray_address,
        on_shard=on_shard,
        on_status=status_lines("evaluate", listener),
        baseline_outcomes=decode_outcomes(baseline_outcomes or {}),
        margin=cfg.registry.promotion.margin,
        min_success=cfg.registry.promotion.min_success,
    )


def _compact(report: EvalReport) -> EvalReport:
    """A report without its per-episode lists (records stay small; the report files keep
    them)."""
    return replace(report, outcomes=[], seeds=[], baseline_outcomes={})
