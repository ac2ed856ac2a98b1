"""The evaluate steps: a policy on ``cfg``'s evaluation suite (optionally against a baseline on
the same seeds), the pipeline's candidate against the champion and the models fine-tuning
started from, each precision variant against FP32, and the champion's regression check."""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.progress import SILENT, Listener, status_lines
from pipelines.records import ChampionCheck, Evaluation
from pipelines.registry.champion import (
    regression_check,
    same_export_champion,
    store_outcomes,
    stored_outcomes,
)
from pipelines.registry.exports import fetch_export
from pipelines.registry.versions import CHAMPION, VersionInfo
from robo_pipe.locks import output_lock

if TYPE_CHECKING:
    from deploy_edge.bundle.io_spec import Variant
    from stages.evaluate.comparison import Comparison
    from stages.evaluate.report import EvalReport
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef


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
    (``base``, unless ``evaluate.play_start`` is off) and, after RL, the BC fine-tune RL
    started from (``warm_start``), on the same suite. With ``export.score_success``, each
    candidate precision variant of the export plays the same seeds against it too
    (:func:`score_variant_success`). Per-episode lists are dropped from the records."""
    baseline = fetch_export(cfg.model_name, champion.version)[1] if champion else None
    stored = stored_outcomes(cfg, champion) if champion else {}
    start = base.path if base and cfg.evaluate.play_start else None
    starts = {"start": start, "warm-start": warm_start}
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
            _evaluate(cfg, Path(path), where, listener, None, ray_address, tally)
            if path is not None
            else None
        )
    warm = reports["warm-start"]
    return Evaluation(
        candidate=_compact(candidate),
        champion_version=champion.version if champion else same_export_champion(cfg, export),
        start=_compact(reports["start"]) if reports["start"] else None,
        warm_start=_compact(warm) if warm else None,
        rl_gain=rl_gain(cfg, warm, candidate) if warm else None,
    )


def rl_gain(cfg: PipelineConfig, warm_start: EvalReport, rl: EvalReport) -> Comparison:
    """RL's gain over its BC warm start on the seeds both played (:attr:`Evaluation.rl_gain`):
    the promotion test's paired exact McNemar with the roles swapped, "is the warm start worse
    than the RL result?" at the gate's confidence."""
    from stages.evaluate.comparison import compare_fixed

    ours, theirs = warm_start.successes_by_episode(), rl.successes_by_episode()
    shared = ours.keys() & theirs.keys()
    seeds = min(len(warm_start.seeds), len(rl.seeds))
    return compare_fixed(
        {k: ours[k] for k in shared}, theirs, seeds, cfg.evaluate.gate_confidence, 0.0, rl.policy
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


def evaluate_champion(
    cfg: PipelineConfig, out: Path, listener: Listener = SILENT, ray_address: str | None = None
) -> ChampionCheck:
    """The champion of ``cfg.model_name`` on the held-out suite, against
    ``registry.promotion.min_success``, and judged again at the current target profile: its
    latency gate measured now, the champion played at the delay that means (as a candidate's
    ``success at device latency``, against itself at zero delay); the result is tagged on the
    version. Reports into ``out`` and ``out``'s sibling ``latency``."""
    from pipelines.steps.latency import measure_latency, play_at_device_delay

    info, bundle = fetch_export(cfg.model_name, CHAMPION)
    report = evaluate_policy(cfg, bundle, out, listener, ray_address=ray_address)
    latency_dir = out.with_name("latency")
    latency = measure_latency(cfg, bundle, latency_dir, listener)
    evaluation = Evaluation(candidate=report, champion_version=None)  # itself: no other
    at = play_at_device_delay(cfg, bundle, latency, evaluation, latency_dir, listener, ray_address)
    return regression_check(cfg, info, _compact(report), at)


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
