"""The champion's bookkeeping in the registry: its stored per-seed outcomes, the comparison's
tags, and the re-check that makes promotion a compare-and-set.

    outcomes_key(cfg)                 what decides each held-out seed's episode (the outcomes'
                                      validity)
    stored_outcomes(cfg, version)     a version's stored per-seed outcomes, if still valid
    outcome_tags(cfg, encoded)        the tags that store them
    store_outcomes(cfg, version, ...) the champion's outcomes extended by those just played
    candidate_outcomes(report)        a candidate's own outcomes, from its report file
    comparison_tags(comparison)       the comparison against the champion as version tags
    same_export_champion(cfg, export) the champion, if it is this very export
    decide_gates(cfg, candidate, ...) every promotion gate's decision
    recheck(cfg, version, ...)        under the promotion lock: compare again with a champion
                                      that moved since the evaluation
    regression_check(cfg, info, ...)  the champion's scheduled check, tagged on it
    without_gates(info, history)      why a champion stands without passed gates (MLflow's own
                                      alias editing, or a forced promotion), if it does
    champion_warning(name, versions)  that, as ``robo-pipe models list/show`` print it

:mod:`pipelines.steps` calls these from ``evaluate_candidate``, ``register_version`` and
``evaluate_champion``; an evaluation this module needs (the champion's export, played again)
comes in as a function, so the steps stay the one place that plays a stage.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.progress import SILENT, Listener
from pipelines.records import ChampionCheck, Evaluation
from pipelines.registry.exports import fetch_export
from pipelines.registry.promotion import champion_history
from pipelines.registry.tags import (
    COMPARISON_TAG,
    LAST_REGRESSION_AT_TAG,
    LAST_REGRESSION_SUCCESS_TAG,
    ONNX_HASH_TAG,
    OUTCOMES_KEY_TAG,
    OUTCOMES_TAG,
    PROMOTED_AT_TAG,
    TAG_VALUE_LIMIT,
)
from pipelines.registry.versions import CHAMPION, VersionInfo, champion, set_version_tags
from robo_pipe.home import unmark_home
from stages.register import Gate, blocking_gates, gate_tags, meets_min_success, promotion_gates
from stages.register.gates import at_latency_gate, held_out_text

if TYPE_CHECKING:
    from deploy_edge.latency_report import LatencyReport
    from stages.evaluate.at_delay import AtDelay
    from stages.evaluate.comparison import Comparison
    from stages.evaluate.report import EvalReport
    from stages.export import ExportRef

EvaluateSuite = Callable[[Path, Path], "EvalReport"]
"""Plays a policy (checkpoint or export) on the config's held-out suite, reporting into a
folder: :func:`pipelines.steps.evaluate.evaluate_policy` bound to the config and the listener."""


# -- stored per-seed outcomes --------------------------------------------------------------------


def outcomes_key(cfg: PipelineConfig) -> str:
    """What decides each held-out seed's episode, whatever ``evaluate.episodes`` is: robot,
    scene and task, simulator and its version, the suite's variants and phrasing, the seed,
    and robo-pipe's code version (its git commit, or its release). Stored outcomes are reused
    only under the same key: a change of any of these evaluates the champion again."""
    import hashlib

    from sim_scenes.backends import simulator_version
    from stages.evaluate import suite_variants
    from stages.provenance import code_version

    what = cfg.model_dump(include={"robot", "sim", "seed"}, mode="json")
    what["scene"] = cfg.scene.model_dump(mode="json")
    what["variants"] = suite_variants(cfg.scene, cfg.evaluate)
    what["phrasing"] = cfg.evaluate.phrasing
    what["versions"] = [simulator_version(cfg.sim), code_version()]
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def stored_outcomes(cfg: PipelineConfig, version: VersionInfo) -> dict[str, str]:
    """``version``'s stored per-seed outcomes on ``cfg``'s suite (encoded), or none when they
    were stored under another :func:`outcomes_key`."""
    tags = version.tags
    if tags.get(OUTCOMES_KEY_TAG) != outcomes_key(cfg):
        return {}
    return {k[len(OUTCOMES_TAG) :]: v for k, v in tags.items() if k.startswith(OUTCOMES_TAG)}


def outcome_tags(cfg: PipelineConfig, encoded: dict[str, str]) -> dict[str, str]:
    """The tags that store ``encoded`` outcomes on a version (see
    :data:`~pipelines.registry.tags.OUTCOMES_TAG`; seeds beyond the tag's limit are not
    stored)."""
    tags = {OUTCOMES_KEY_TAG: outcomes_key(cfg)}
    for variant, chars in encoded.items():
        tags[OUTCOMES_TAG + variant] = chars[:TAG_VALUE_LIMIT]
    return tags


def store_outcomes(
    cfg: PipelineConfig,
    version: VersionInfo,
    stored: dict[str, str],
    played: dict[str, str],
) -> None:
    """Tag ``version`` (the champion a candidate was compared with) with its ``stored``
    outcomes extended by those it just ``played`` (encoded), for the next candidate."""
    merged = _merged(stored, played)
    set_version_tags(cfg.model_name, version.version, outcome_tags(cfg, merged))


def _merged(old: dict[str, str], new: dict[str, str]) -> dict[str, str]:
    """Stored outcomes extended by new ones (each seed's outcome is the same wherever it was
    played, so either may fill a gap)."""
    from stages.evaluate.sequential import decode_outcomes, encode_outcomes

    return encode_outcomes({**decode_outcomes(old), **decode_outcomes(new)})


def candidate_outcomes(report: EvalReport) -> dict[str, str]:
    """A candidate's per-seed outcomes, from its full ``eval_report.json`` (the record passed
    between stages has no per-episode lists)."""
    from stages.evaluate.report import EvalReport
    from stages.evaluate.sequential import encode_outcomes

    path = _report_file(report)
    if not path.is_file():
        return {}
    full = EvalReport.from_json(unmark_home(json.loads(path.read_text())))
    return encode_outcomes(full.successes_by_episode())


def _report_file(report: EvalReport) -> Path:
    """The ``eval_report.json`` written beside a report's markdown (it keeps the episodes)."""
    return Path(report.report).with_name("eval_report.json")


# -- the comparison against the champion ---------------------------------------------------------


def comparison_tags(comparison: Comparison | None) -> dict[str, str]:
    """The comparison's figures as version tags (none without a comparison; the keys:
    :data:`~pipelines.registry.tags.COMPARISON_TAG`)."""
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
    return {COMPARISON_TAG + k: str(v) for k, v in figures.items()}


def same_export_champion(cfg: PipelineConfig, export: ExportRef) -> str | None:
    """The champion's version if it is this very export (nothing to compare with), else None.
    The version recorded is always the one the candidate was compared with: never a champion
    that another run promoted while this one was evaluating."""
    current = champion(cfg.model_name)
    if current and current.tags.get(ONNX_HASH_TAG) == export.onnx_hash:
        return current.version
    return None


# -- promotion: the compare-and-set --------------------------------------------------------------


def decide_gates(
    cfg: PipelineConfig,
    candidate: EvalReport,
    compared_with: str | None,
    latency: LatencyReport,
    random_weights: bool = False,
) -> dict[str, Gate]:
    """Every promotion gate's decision on ``candidate`` (compared with champion version
    ``compared_with``, None: there was none) and its latency report. A policy of random
    weights also fails the ``real weights`` gate: the config's (``policy.weights: random``) or
    the export's (``random_weights``: its spec says so, whatever config registers it). The
    candidate at its target's delay, where the latency step played it, decides ``success at
    device latency``."""
    from stages.evaluate.at_delay import read_at_delay

    return promotion_gates(
        cfg.registry.promotion,
        candidate,
        compared_with,
        latency,
        cfg.evaluate.gate_confidence,
        random_weights=random_weights or cfg.policy.random_weights,
        # played by the latency step, beside its report (none: not measured, no such gate)
        at_latency=read_at_delay(Path(latency.report).parent) if latency.report else None,
    )


def recheck(
    cfg: PipelineConfig,
    version: str,
    evaluation: Evaluation,
    gates: dict[str, Gate],
    latency: LatencyReport,
    evaluate: EvaluateSuite,
    listener: Listener = SILENT,
    at_delay: Callable[[str], None] | None = None,
) -> dict[str, Gate]:
    """The compare of the compare-and-set, run under the model's
    :func:`~pipelines.registry.promotion.promotion_lock` by whoever registered ``version`` (the
    candidate): the champion is read again, and if another run promoted a version since
    ``evaluation`` compared the candidate with its champion, the candidate is compared again
    with that one, on the same seeds (its stored per-seed outcomes when they cover them, else
    ``evaluate`` plays its export), ``at_delay`` (given a champion version) plays it at its
    device's delay against that one too, and the ``gates`` are decided again and tagged on
    ``version`` with the comparison's figures. Returns the gates that decide promotion."""
    candidate, compared_with = evaluation.candidate, evaluation.champion_version
    current = champion(cfg.model_name)
    while (
        not blocking_gates(gates)
        and current is not None
        and current.version not in (compared_with, version)
    ):  # the champion moved since the evaluation: compare with the one there is now
        listener.advanced(
            "register",
            0,
            f"champion is now v{current.version} (evaluated against "
            f"{'v' + compared_with if compared_with else 'no champion'}): comparing again",
        )
        comparison = _recompare(cfg, candidate, current, evaluate)
        candidate = replace(candidate, comparison=comparison)
        compared_with = current.version
        if at_delay is not None:  # the same champion at the device's delay
            at_delay(current.version)
        gates = decide_gates(cfg, candidate, compared_with, latency)
        set_version_tags(
            cfg.model_name, version, {**gate_tags(gates), **comparison_tags(comparison)}
        )
    return gates


def _recompare(
    cfg: PipelineConfig,
    candidate: EvalReport,
    baseline: VersionInfo,
    evaluate: EvaluateSuite,
) -> Comparison:
    """``candidate`` against the champion ``baseline`` on the candidate's seeds: its stored
    per-seed outcomes when they cover them, else a fresh evaluation of its export."""
    from stages.evaluate.comparison import compare, compare_fixed
    from stages.evaluate.report import EvalReport
    from stages.evaluate.sequential import decode_outcomes

    full = EvalReport.from_json(unmark_home(json.loads(_report_file(candidate).read_text())))
    mine = full.successes_by_episode()
    stored = decode_outcomes(stored_outcomes(cfg, baseline))
    confidence, margin = cfg.evaluate.gate_confidence, cfg.registry.promotion.margin
    name = f"v{baseline.version}"
    if mine and mine.keys() <= stored.keys():
        return compare_fixed(mine, stored, len(full.seeds), confidence, margin, name)
    _, bundle = fetch_export(cfg.model_name, baseline.version)
    out = Path(candidate.report).parent.with_name(f"champion-{name}")
    played = evaluate(bundle, out)
    return replace(compare(full, played, confidence, margin), baseline=name)


# -- the champion's scheduled check --------------------------------------------------------------


def regression_check(
    cfg: PipelineConfig, info: VersionInfo, report: EvalReport, at: AtDelay | None = None
) -> ChampionCheck:
    """The champion ``info``'s held-out ``report`` (without per-episode lists) against
    ``registry.promotion.min_success``, and ``at``, the champion at the current target's
    delay, by the ``success at device latency`` gate's rule (where enforced); the result is
    tagged on the version."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    set_version_tags(
        info.name,
        info.version,
        {
            LAST_REGRESSION_SUCCESS_TAG: f"{report.success_rate:.4f}",
            LAST_REGRESSION_AT_TAG: stamp,
        },
    )
    policy = cfg.registry.promotion
    measured, required = held_out_text(report, policy)
    passed = meets_min_success(report, policy)
    if at is not None:
        gate = at_latency_gate(at, policy, cfg.evaluate.gate_confidence)
        measured += f"; at {at.target}'s delay: {gate.measured}"
        required += " and at the delay, not worse there than at zero delay"
        passed = passed and (gate.passed or not gate.enforced)
    return ChampionCheck(
        model_name=info.name,
        version=info.version,
        evaluation=report,
        min_success=policy.min_success,
        measured=measured,
        required=required,
        passed=passed,
    )


# -- a champion the gates did not pass -----------------------------------------------------------


def without_gates(info: VersionInfo, history: list[str]) -> str | None:
    """Why the champion ``info`` stands without having passed the gates, or None when
    robo-pipe promoted it with every enforced gate passed. ``history``: the model's champion
    history (:func:`~pipelines.registry.promotion.champion_history`), which robo-pipe moves
    together with the alias: MLflow's own alias editing and "Promote model" move the alias
    alone, past every gate, and leave the champion off the end of it."""
    promoted_by_robo_pipe = PROMOTED_AT_TAG in info.tags
    if not promoted_by_robo_pipe or history[-1:] != [info.version]:
        return "made champion outside robo-pipe (MLflow's alias editing bypasses the gates)"
    gates = info.gates
    if not gates:
        return "no gate results recorded on this version"
    failed = blocking_gates(gates)
    if failed:
        return f"promoted by force past failed gates: {', '.join(failed)}"
    return None


def champion_warning(name: str, versions: list[VersionInfo]) -> str | None:
    """What ``robo-pipe models list`` and ``models show`` say of ``name``'s champion when it
    is among ``versions`` and stands without having passed the gates (:func:`without_gates`);
    None otherwise."""
    current = next((v for v in versions if CHAMPION in v.aliases), None)
    if current is None:
        return None
    if current.random_weights:  # only MLflow's own alias editing can have put it there
        return (
            f"{name} v{current.version} is champion with random weights (a systems test): "
            "made champion outside robo-pipe; roll it back"
        )
    why = without_gates(current, champion_history(name))
    if why is None:
        return None
    return f"{name} v{current.version} is champion without passing the gates: {why}"
