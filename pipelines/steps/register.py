"""The register step: the export as a registry version with its lineage and every gate's
decision, promoted to ``champion`` under the promotion lock only if no enforced gate failed."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.progress import SILENT, Listener
from pipelines.records import Evaluation, Registration
from pipelines.registry.champion import (
    candidate_outcomes,
    comparison_tags,
    decide_gates,
    outcome_tags,
    recheck,
)
from pipelines.registry.exports import register_export
from pipelines.registry.promotion import promote, promotion_lock
from pipelines.registry.tags import (
    BASE_HASH_TAG,
    BASE_MODEL_TAG,
    CHECKPOINT_HASH_TAG,
    CODE_VERSION_TAG,
    CONFIG_HASH_TAG,
    DATASET_HASH_TAG,
    GATED_TARGET_TAG,
    INFERENCE_P99_TAG,
    LATENCY_P99_TAG,
    ONNX_HASH_TAG,
    SUCCESS_RATE_TAG,
)
from pipelines.registry.versions import (
    CANDIDATE,
    CHAMPION,
    find_export,
    set_alias,
    set_version_tags,
)
from pipelines.steps.evaluate import evaluate_policy
from pipelines.steps.latency import replay_at_device_delay
from robo_pipe.home import mark_home
from stages.register import blocking_gates, gate_tags

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport
    from pipelines.tracking import TrackedRun
    from stages.dataset.layout import DatasetRef
    from stages.export import ExportRef
    from stages.policy.checkpoint import CheckpointRef


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
        BASE_MODEL_TAG: mark_home(base.path) if base else "",
        BASE_HASH_TAG: base.hash if base else "",
        CHECKPOINT_HASH_TAG: checkpoint.content_hash,
        ONNX_HASH_TAG: export.onnx_hash,
        CONFIG_HASH_TAG: cfg.config_hash(),
        CODE_VERSION_TAG: code,
        SUCCESS_RATE_TAG: f"{candidate.success_rate:.4f}",
        LATENCY_P99_TAG: f"{latency.p99_ms:.3f}",
        INFERENCE_P99_TAG: f"{latency.inference_ms:.3f}",
        GATED_TARGET_TAG: latency.target,
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
        at_delay = partial(
            replay_at_device_delay, cfg, Path(export.path), latency, evaluation, listener=listener
        )
        gates = recheck(cfg, info.version, evaluation, gates, latency, evaluate, listener, at_delay)
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
