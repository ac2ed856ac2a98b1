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

import json
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines import registry
from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.progress import SILENT, Listener, rl_detail, status_lines, training_detail
from pipelines.records import ChampionCheck, Evaluation, Registration
from robo_pipe.errors import InputError
from robo_pipe.locks import output_lock
from stages.register import Gate, blocking_gates, gate_tags, meets_min_success, promotion_gates
from stages.register.gates import held_out_text

if TYPE_CHECKING:
    from deploy_edge.latency import LatencyReport
    from pipelines.tracking import TrackedRun
    from stages.dataset.layout import DatasetRef
    from stages.evaluate.report import Comparison, EvalReport
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
    if cfg.policy.type != "default":
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
    with ``dataset``, on its frames), at ``cfg``'s robot's control rate. One exporter per
    ``out`` at a time: a run that waited for another gets that one's export back."""
    from robots.spec import get_robot
    from stages.export import export

    listener.started("export", None, "")
    with output_lock(out, "export", status_lines("export", listener)):
        return export(checkpoint, out, get_robot(cfg.robot).control_hz, cfg.seed, dataset=dataset)


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


OUTCOMES_TAG = "outcomes"
"""Version tags (after the ``robo_pipe.`` prefix): ``outcomes.<variant>`` = the version's
per-seed outcomes on the held-out suite (:func:`stages.evaluate.sequential.encode_outcomes`),
valid while ``outcomes_key`` equals :func:`outcomes_key` of the config comparing with it."""
TAG_LIMIT = 5000
"""Characters MLflow keeps in a model version tag's value: seeds beyond are not stored."""


def outcomes_key(cfg: PipelineConfig) -> str:
    """What decides each held-out seed's episode, whatever ``evaluate.episodes`` is: robot,
    scene and task, simulator and its version, the suite's variants, the seed, and
    robo-pipe's code version (its git commit, or its release). Stored outcomes are reused
    only under the same key: a change of any of these evaluates the champion again."""
    import hashlib

    from sim_scenes.backends import simulator_version
    from stages.evaluate import suite_variants
    from stages.provenance import code_version

    what = cfg.model_dump(include={"robot", "sim", "seed"}, mode="json")
    what["scene"] = cfg.scene.model_dump(mode="json")
    what["variants"] = suite_variants(cfg.scene, cfg.evaluate)
    what["versions"] = [simulator_version(cfg.sim), code_version()]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def stored_outcomes(cfg: PipelineConfig, version: registry.VersionInfo) -> dict[str, str]:
    """``version``'s stored per-seed outcomes on ``cfg``'s suite (encoded), or none when they
    were stored under another :func:`outcomes_key`."""
    tags = version.tags
    if tags.get(registry.TAG + OUTCOMES_TAG + "_key") != outcomes_key(cfg):
        return {}
    prefix = registry.TAG + OUTCOMES_TAG + "."
    return {k[len(prefix) :]: v for k, v in tags.items() if k.startswith(prefix)}


def outcome_tags(cfg: PipelineConfig, encoded: dict[str, str]) -> dict[str, str]:
    """The tags that store ``encoded`` outcomes on a version (see :data:`OUTCOMES_TAG`)."""
    tags = {registry.TAG + OUTCOMES_TAG + "_key": outcomes_key(cfg)}
    for variant, chars in encoded.items():
        tags[registry.TAG + OUTCOMES_TAG + "." + variant] = chars[:TAG_LIMIT]
    return tags


def _merged(old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """Stored outcomes extended by new ones (each seed's outcome is the same wherever it was
    played, so either may fill a gap)."""
    from stages.evaluate.sequential import decode_outcomes, encode_outcomes

    return encode_outcomes({**decode_outcomes(old), **decode_outcomes(new)})


def evaluate_candidate(
    cfg: PipelineConfig,
    export: ExportRef,
    base: CheckpointRef | None,
    champion: registry.VersionInfo | None,
    out: Path,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    warm_start: Path | None = None,
) -> Evaluation:
    """The pipeline's evaluation: the export on the held-out suite against ``champion``'s
    export on the same seeds (the no-regression gate), and the model fine-tuning started from
    (``base``) and, after RL, the BC fine-tune RL started from (``warm_start``), on the same
    suite. Per-episode lists are dropped from the records."""
    baseline = registry.fetch_export(cfg.model_name, champion.version)[1] if champion else None
    stored = stored_outcomes(cfg, champion) if champion else {}
    starts = {"start": base.path if base else None, "warm-start": warm_start}
    policies = 1 + (baseline is not None) + sum(p is not None for p in starts.values())
    listener.started("evaluate", policies * _suite_episodes(cfg), "episodes")
    tally = _Tally()
    candidate = _evaluate(
        cfg, Path(export.path), out, listener, baseline, ray_address, tally, stored
    )
    if champion is not None and candidate.baseline_outcomes:  # kept for the next candidate
        merged = _merged(stored, candidate.baseline_outcomes)
        registry.set_version_tags(cfg.model_name, champion.version, outcome_tags(cfg, merged))
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
        champion_version=champion.version if champion else _same_export_champion(cfg, export),
        start=reports["start"],
        warm_start=reports["warm-start"],
    )


def _same_export_champion(cfg: PipelineConfig, export: ExportRef) -> str | None:
    """The champion's version if it is this very export (nothing to compare with), else None.
    The version recorded is always the one the candidate was compared with: never a champion
    that another run promoted while this one was evaluating."""
    current = registry.champion(cfg.model_name)
    if current and current.tags.get(registry.TAG + "onnx_hash") == export.onnx_hash:
        return current.version
    return None


def measure_latency(
    cfg: PipelineConfig, export: Path, out: Path, listener: Listener = SILENT
) -> LatencyReport:
    """The latency gate (``cfg.latency``): the export in the control loop of ``cfg``'s
    simulated robot on the target profile's engine, p99 against the budget. Reports into
    ``out``."""
    from deploy_edge.bundle import read_io_spec
    from deploy_edge.latency import load_target, run_gate
    from robots.spec import get_robot
    from sim_scenes.sim_robot import SimulatedRobot

    gate = cfg.latency
    profile = load_target(gate.target)
    spec = read_io_spec(export)
    robot = SimulatedRobot(
        get_robot(cfg.robot),
        cfg.scene.task(),
        seed=cfg.seed,
        cameras=tuple(spec.cameras),
        image_size=spec.image_size,
    )
    robot.connect()  # the gate runs the control loop on its first episode's instruction
    instruction = robot.instruction
    robot.stop()
    listener.started("latency", None, "")
    listener.advanced("latency", 0, f"measuring {gate.steps} control steps on {profile.name}")
    out.mkdir(parents=True, exist_ok=True)
    return run_gate(
        export, robot, instruction, profile, gate.steps, gate.warmup, gate.budget_ms, gate.pace, out
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

    Promotion is a compare-and-set under the model's :func:`~pipelines.registry.promotion_lock`:
    the champion is read again there, and if another run promoted a version since ``export``
    was evaluated, the candidate is compared again with that one, on the same seeds (its
    stored per-seed outcomes when they cover them, else a fresh evaluation of its export),
    and the gates are decided again before the alias may move. The version is tagged with its
    own per-seed outcomes (for the candidates after it) and the comparison's figures."""
    listener.started("register", None, "")
    candidate, compared_with = evaluation.candidate, evaluation.champion_version
    gates = _gates(cfg, candidate, compared_with, latency)
    base = checkpoint.base
    tags = {
        registry.TAG + "dataset_hash": dataset.content_hash,
        registry.TAG + "base_model": base.path if base else "",
        registry.TAG + "base_hash": base.hash if base else "",
        registry.TAG + "checkpoint_hash": checkpoint.content_hash,
        registry.TAG + "onnx_hash": export.onnx_hash,
        registry.TAG + "config_hash": cfg.config_hash(),
        registry.TAG + "code_version": code,
        registry.TAG + "success_rate": f"{candidate.success_rate:.4f}",
        registry.TAG + "latency_p99_ms": f"{latency.p99_ms:.3f}",
        **gate_tags(gates),
        **comparison_tags(candidate.comparison),
        **outcome_tags(cfg, _own_outcomes(candidate)),
    }
    with registry.promotion_lock(cfg.model_name):
        same = registry.find_export(cfg.model_name, export.onnx_hash)
        if same is None:
            info = registry.register_export(Path(export.path), cfg.model_name, run, tags)
        else:
            registry.set_version_tags(cfg.model_name, same.version, tags)
            info = registry.set_alias(cfg.model_name, registry.CANDIDATE, same.version)
        current = registry.champion(cfg.model_name)
        while (
            not blocking_gates(gates)
            and current is not None
            and current.version not in (compared_with, info.version)
        ):  # the champion moved since the evaluation: compare with the one there is now
            listener.advanced(
                "register",
                0,
                f"champion is now v{current.version} (evaluated against "
                f"{'v' + compared_with if compared_with else 'no champion'}): comparing again",
            )
            comparison = _recompare(cfg, candidate, current, run, listener)
            candidate = replace(candidate, comparison=comparison)
            compared_with = current.version
            gates = _gates(cfg, candidate, compared_with, latency)
            registry.set_version_tags(
                cfg.model_name, info.version, {**gate_tags(gates), **comparison_tags(comparison)}
            )
        blocking = blocking_gates(gates)
        if not blocking and registry.CHAMPION not in info.aliases:
            reason = f"pipeline run {run.run_id}: all gates passed"
            info = registry.promote(cfg.model_name, info.version, reason)
    return Registration(
        name=info.name,
        version=info.version,
        aliases=info.aliases,
        promoted=not blocking,
        blocked_by=blocking,
        gates=gates,
        source=info.source,
    )


COMPARISON_TAG = "comparison."
"""Version tags (after the ``robo_pipe.`` prefix) with the comparison against the champion:
``comparison.test``, ``.candidate_only``, ``.baseline_only``, ``.p_value``, ``.boundary``,
``.decision``, ``.seeds`` (per variant, of ``.max_seeds``), ``.look``,
``.detectable_regression``, ``.played_on`` (seeds per variant the candidate played alone for
the success gate)."""


def comparison_tags(comparison: Comparison | None) -> dict[str, str]:
    """The comparison's figures as version tags (none without a comparison)."""
    if comparison is None:
        return {}
    c = comparison
    figures = {
        "test": c.test,
        "candidate_only": c.discordant["candidate_only"],
        "baseline_only": c.discordant["baseline_only"],
        "p_value": f"{c.p_value:.6g}",
        "boundary": f"{c.boundary:.6g}",
        "decision": c.decision,
        "seeds": c.seeds,
        "max_seeds": c.max_seeds,
        "look": f"{c.look} of {len(c.looks)}",
        "detectable_regression": f"{c.detectable_regression:.4f}",
        "played_on": c.played_on,
    }
    return {registry.TAG + COMPARISON_TAG + k: str(v) for k, v in figures.items()}


def _own_outcomes(report: EvalReport) -> dict[str, str]:
    """A candidate's per-seed outcomes, from its full ``eval_report.json`` (the record passed
    between stages has no per-episode lists)."""
    from stages.evaluate.report import EvalReport
    from stages.evaluate.sequential import encode_outcomes

    path = _report_file(report)
    if not path.is_file():
        return {}
    full = EvalReport.from_json(json.loads(path.read_text()))
    return encode_outcomes(full.successes_by_episode())


def _gates(
    cfg: PipelineConfig, candidate: EvalReport, compared_with: str | None, latency: LatencyReport
) -> dict[str, Gate]:
    return promotion_gates(
        cfg.registry.promotion, candidate, compared_with, latency, cfg.evaluate.gate_confidence
    )


def _report_file(report: EvalReport) -> Path:
    """The ``eval_report.json`` written beside a report's markdown (it keeps the episodes)."""
    return Path(report.report).with_name("eval_report.json")


def _recompare(
    cfg: PipelineConfig,
    candidate: EvalReport,
    champion: registry.VersionInfo,
    run: TrackedRun,
    listener: Listener,
) -> Comparison:
    """``candidate`` against ``champion`` on the candidate's seeds: the champion's stored
    per-seed outcomes when they cover them, else a fresh evaluation of its export."""
    from stages.evaluate.report import EvalReport, compare, compare_fixed
    from stages.evaluate.sequential import decode_outcomes

    full = EvalReport.from_json(json.loads(_report_file(candidate).read_text()))
    mine = full.successes_by_episode()
    stored = decode_outcomes(stored_outcomes(cfg, champion))
    confidence, margin = cfg.evaluate.gate_confidence, cfg.registry.promotion.margin
    name = f"v{champion.version}"
    if mine and mine.keys() <= stored.keys():
        return compare_fixed(mine, stored, len(full.seeds), confidence, margin, name)
    _, bundle = registry.fetch_export(cfg.model_name, champion.version)
    out = Path(candidate.report).parent.with_name(f"champion-{name}")
    baseline = evaluate_policy(cfg, bundle, out, listener)
    return replace(compare(full, baseline, confidence, margin), baseline=name)


def evaluate_champion(
    cfg: PipelineConfig, out: Path, listener: Listener = SILENT, ray_address: str | None = None
) -> ChampionCheck:
    """The champion of ``cfg.model_name`` on the held-out suite, against
    ``registry.promotion.min_success``; the result is tagged on the version."""
    info, bundle = registry.fetch_export(cfg.model_name, registry.CHAMPION)
    report = evaluate_policy(cfg, bundle, out, listener, ray_address=ray_address)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    registry.set_version_tags(
        info.name,
        info.version,
        {
            registry.TAG + "last_regression_success": f"{report.success_rate:.4f}",
            registry.TAG + "last_regression_at": stamp,
        },
    )
    policy = cfg.registry.promotion
    measured, required = held_out_text(report, policy)
    return ChampionCheck(
        model_name=info.name,
        version=info.version,
        evaluation=_compact(report),
        min_success=policy.min_success,
        measured=measured,
        required=required,
        passed=meets_min_success(report, policy),
    )


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
