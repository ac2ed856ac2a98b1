"""Promotion to ``champion``: the gates a candidate must pass, decided on the evaluate and
latency stages' records (plain functions: no Prefect, no MLflow).

The register stage records every gate's decision on the version and moves ``champion`` only
when no enforced gate failed; the champion check holds the champion to the same
``min_success``.
"""

from __future__ import annotations

from pipelines.config import PipelineConfig, PromotionConfig
from pipelines.resume import Record


def meets_min_success(success_rate: float, policy: PromotionConfig) -> bool:
    """Whether a held-out success rate (0..1) reaches ``policy.min_success``."""
    return success_rate >= policy.min_success


def promotion_gates(cfg: PipelineConfig, evaluation: Record, latency: Record) -> dict[str, Record]:
    """Every gate's decision: passed, enforced (by ``registry.promotion``), measured, required."""
    policy = cfg.registry.promotion
    cand = evaluation["candidate"]
    comparison = cand.get("comparison")
    gates = {
        "held-out success": {
            "passed": meets_min_success(cand["success_rate"], policy),
            "enforced": True,
            "measured": f"{cand['success_rate']:.1%} "
            f"(95% CI {cand['ci95'][0]:.1%} - {cand['ci95'][1]:.1%})",
            "required": f">= {policy.min_success:.0%}",
        },
        "no regression vs champion": {
            "passed": comparison is None or bool(comparison["passed"]),
            "enforced": policy.no_regression,
            "measured": (
                f"{comparison['difference']:+.1%} vs v{evaluation['champion_version']}, "
                f"p = {comparison['p_value']:.3f}"
                if comparison
                else f"is champion v{evaluation['champion_version']} (same export)"
                if evaluation["champion_version"]
                else "no champion yet"
            ),
            "required": f"not worse at {cfg.evaluate.gate_confidence:.0%} confidence",
        },
        "latency": {
            "passed": bool(latency["passed"]),
            "enforced": policy.latency,
            "measured": f"p99 {latency['p99_ms']:.2f} ms, {latency['misses']} misses "
            f"on {latency['target']}",
            "required": f"p99 <= {latency['budget_ms']:g} ms, "
            f"misses <= {latency['allowed_misses']}",
        },
    }
    return gates


def blocking_gates(gates: dict[str, Record]) -> list[str]:
    """The gates that keep a version from ``champion``: enforced and failed, in order."""
    return [name for name, g in gates.items() if g["enforced"] and not g["passed"]]
