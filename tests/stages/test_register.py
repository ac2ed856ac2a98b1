"""The register stage's rules on hand-made records: each promotion gate passes and fails at its
boundary, the success bar is held against the lower end of the 95% interval unless the config
says the estimate, an unenforced gate reports but does not block, the measured and required
values are said; the gate tags read back to the same gates; a failed version is promoted only
by force; the champion history moves forward on promotion and back on rollback."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config
from stages.register import (
    GATE_TAG,
    Gate,
    PromotionConfig,
    blocking_gates,
    gate_tags,
    gates_from_tags,
    history_after_promotion,
    may_promote,
    meets_min_success,
    rollback_target,
)
from stages.register import promotion_gates as gates_of
from stages.statistics import wilson_interval

ON_ESTIMATE = "registry.promotion.min_success_on=estimate"
"""For the tests of the other gates: :func:`evaluation`'s fixed 60-80% interval is below the
70% bar, so they compare the point estimate and the held-out gate passes on it."""


def evaluation(
    success: float,
    comparison: dict[str, Any] | None = None,
    champion: str | None = None,
    ci95: tuple[float, float] = (0.6, 0.8),
) -> tuple[SimpleNamespace, str | None]:
    """What the evaluate stage hands on: the candidate's success and its 95% interval (60-80%
    unless given) and its comparison with the champion ``champion`` on the same seeds."""
    compared = SimpleNamespace(**comparison) if comparison else None
    return SimpleNamespace(success_rate=success, ci95=ci95, comparison=compared), champion


def latency(passed: bool = True, p99: float = 2.5, misses: int = 0) -> SimpleNamespace:
    return SimpleNamespace(
        passed=passed,
        p99_ms=p99,
        misses=misses,
        target="local-cpu",
        budget_ms=100.0,
        allowed_misses=0,
        report="",  # no folder: nothing was played at the target's delay
    )


def config(*overrides: str) -> PipelineConfig:
    return load_config(CONFIG_DIR / "demo.yaml", list(overrides))


def promotion_gates(
    cfg: PipelineConfig,
    evaluated: tuple[SimpleNamespace, str | None],
    lat: SimpleNamespace,
    at: Any = None,
) -> dict[str, Gate]:
    candidate, champion = evaluated
    confidence = cfg.evaluate.gate_confidence
    return gates_of(cfg.registry.promotion, candidate, champion, lat, confidence, at_latency=at)


def held_out(success: float, low: float) -> SimpleNamespace:
    return SimpleNamespace(success_rate=success, ci95=(low, 1.0))


def test_min_success_is_inclusive() -> None:
    policy = PromotionConfig(min_success=0.7)  # on the lower bound by default
    assert meets_min_success(held_out(0.8, 0.7), policy)
    assert meets_min_success(held_out(0.8, 0.71), policy)
    assert not meets_min_success(held_out(0.8, 0.6999), policy)
    on_estimate = PromotionConfig(min_success=0.7, min_success_on="estimate")
    assert meets_min_success(held_out(0.7, 0.5), on_estimate)
    assert meets_min_success(held_out(0.71, 0.5), on_estimate)
    assert not meets_min_success(held_out(0.6999, 0.5), on_estimate)


def test_an_estimate_above_the_bar_on_few_episodes_is_blocked_unless_on_estimate() -> None:
    """15 of 20 episodes: 75% clears a 70% bar, but the 95% interval reaches down to 53%."""
    few = evaluation(0.75, ci95=wilson_interval(15, 20))
    gate = promotion_gates(config(), few, latency())["held-out success"]
    assert not gate.passed and gate.enforced
    assert gate.measured == "lower end 53.1% (estimate 75.0%, 95% CI 53.1% - 88.8%)"
    assert gate.required == ">= 70% (lower end of the 95% CI)"

    gates = promotion_gates(config(ON_ESTIMATE), few, latency())
    gate = gates["held-out success"]
    assert gate.passed and blocking_gates(gates) == []
    assert gate.measured == "estimate 75.0% (95% CI 53.1% - 88.8%)"
    assert gate.required == ">= 70% (point estimate)"


def test_a_lower_bound_above_the_bar_passes_by_default() -> None:
    """190 of 200 episodes: the whole 95% interval (91.0% - 97.3%) is above 70%."""
    many = evaluation(0.95, ci95=wilson_interval(190, 200))
    gate = promotion_gates(config(), many, latency())["held-out success"]
    assert gate.passed
    assert gate.measured == "lower end 91.0% (estimate 95.0%, 95% CI 91.0% - 97.3%)"


def test_every_gate_passes_and_nothing_blocks() -> None:
    worse_but_within_noise = {"passed": True, "difference": -0.02, "p_value": 0.31}
    gates = promotion_gates(
        config(ON_ESTIMATE), evaluation(0.72, worse_but_within_noise, "3"), latency()
    )
    assert all(g.passed for g in gates.values()) and blocking_gates(gates) == []
    assert gates["no regression vs champion"].measured == "-2.0% vs v3, p = 0.310"


def test_below_min_success_blocks_and_says_measured_and_required() -> None:
    gates = promotion_gates(config(), evaluation(0.65), latency())
    gate = gates["held-out success"]
    assert not gate.passed and gate.enforced
    assert gate.measured == "lower end 60.0% (estimate 65.0%, 95% CI 60.0% - 80.0%)"
    assert gate.required == ">= 70% (lower end of the 95% CI)"
    assert blocking_gates(gates) == ["held-out success"]

    gates = promotion_gates(config(ON_ESTIMATE), evaluation(0.65), latency())
    gate = gates["held-out success"]
    assert not gate.passed and gate.enforced
    assert gate.measured == "estimate 65.0% (95% CI 60.0% - 80.0%)"
    assert gate.required == ">= 70% (point estimate)"
    assert blocking_gates(gates) == ["held-out success"]


def test_a_regression_against_the_champion_blocks() -> None:
    regression = {"passed": False, "difference": -0.15, "p_value": 0.004}
    gates = promotion_gates(config(ON_ESTIMATE), evaluation(0.75, regression, "2"), latency())
    gate = gates["no regression vs champion"]
    assert not gate.passed and gate.measured == "-15.0% vs v2, p = 0.004"
    assert gate.required == "not worse at 95% confidence"
    assert blocking_gates(gates) == ["no regression vs champion"]


@pytest.mark.parametrize(
    ("champion", "measured"),
    [(None, "no champion yet"), ("4", "is champion v4 (same export)")],
)
def test_without_a_comparison_there_is_no_regression(champion: str | None, measured: str) -> None:
    gates = promotion_gates(config(), evaluation(0.9, None, champion), latency())
    assert gates["no regression vs champion"].passed
    assert gates["no regression vs champion"].measured == measured


def test_a_failed_latency_gate_blocks_with_its_figures() -> None:
    gates = promotion_gates(
        config(ON_ESTIMATE), evaluation(0.9), latency(False, p99=123.456, misses=3)
    )
    gate = gates["latency"]
    assert not gate.passed
    assert gate.measured == "p99 123.46 ms, 3 misses on local-cpu"
    assert gate.required == "p99 <= 100 ms, misses <= 0"
    assert blocking_gates(gates) == ["latency"]


def test_unenforced_gates_report_but_do_not_block() -> None:
    cfg = config("registry.promotion.no_regression=false", "registry.promotion.latency=false")
    regression = {"passed": False, "difference": -0.3, "p_value": 0.0001}
    gates = promotion_gates(cfg, evaluation(0.5, regression, "1"), latency(False))
    assert [name for name, g in gates.items() if not g.passed] == [
        "held-out success",
        "no regression vs champion",
        "latency",
    ]
    assert not gates["latency"].enforced and not gates["no regression vs champion"].enforced
    assert gates["held-out success"].enforced, "min_success always holds"
    assert blocking_gates(gates) == ["held-out success"]


def test_gate_tags_read_back_to_the_same_gates() -> None:
    regression = {"passed": False, "difference": -0.15, "p_value": 0.004}
    cfg = config("registry.promotion.latency=false")
    gates = promotion_gates(cfg, evaluation(0.75, regression, "2"), latency(False))
    tags = gate_tags(gates)
    assert tags[GATE_TAG + "latency"] == "failed" and tags[GATE_TAG + "latency.enforced"] == "false"
    assert tags[GATE_TAG + "held-out success.required"] == ">= 70% (lower end of the 95% CI)"
    back = gates_from_tags({**tags, "robo_pipe.onnx_hash": "abc"})  # other tags are ignored
    assert back == dict(sorted(gates.items()))


def test_versions_tagged_before_enforcement_was_recorded_read_as_enforced() -> None:
    old = {GATE_TAG + "latency": "failed", GATE_TAG + "latency.measured": "p99 200 ms"}
    assert gates_from_tags(old) == {
        "latency": Gate(passed=False, enforced=True, measured="p99 200 ms", required="")
    }


def test_a_version_that_failed_a_gate_is_promoted_only_by_force() -> None:
    gates = promotion_gates(config(), evaluation(0.5), latency(False))
    tags = gate_tags(gates)
    assert may_promote(tags, force=False) == (False, ["held-out success", "latency"])
    assert may_promote(tags, force=True) == (True, ["held-out success", "latency"])
    passed = gate_tags(promotion_gates(config(ON_ESTIMATE), evaluation(0.9), latency()))
    assert may_promote(passed, force=False) == (True, [])
    # an unenforced gate that failed still needs force: the version did fail it
    lax_cfg = config(ON_ESTIMATE, "registry.promotion.latency=false")
    lax = gate_tags(promotion_gates(lax_cfg, evaluation(0.9), latency(False)))
    assert may_promote(lax, force=False) == (False, ["latency"])


def test_promotion_and_rollback_move_through_the_champion_history() -> None:
    history = history_after_promotion([], "1")
    history = history_after_promotion(history, "3")
    assert history == ["1", "3"]
    assert history_after_promotion(history, "1") == ["3", "1"], "promoted again: moves last"
    assert rollback_target(["1", "3"], "3") == ("1", ["1"])
    assert rollback_target(["1", "2", "4"], "4") == ("2", ["1", "2"])
    assert rollback_target(["3"], "3") is None, "nothing to roll back to"
    # a champion set by hand outside the history rolls back to the last recorded one
    assert rollback_target(["1", "2"], "5") == ("2", ["1", "2"])


def test_random_weights_fail_an_enforced_gate_that_no_setting_turns_off() -> None:
    """Every other gate passes or is not enforced: the ``real weights`` gate still blocks, and
    its tags read back as failed (``models promote`` without --force refuses it; with --force
    the registry itself does: tests/pipelines/test_promotion.py)."""
    from pipelines.registry.champion import decide_gates
    from stages.register.gates import REAL_WEIGHTS

    lax = config(
        ON_ESTIMATE,
        "registry.promotion.min_success=0.0",
        "registry.promotion.no_regression=false",
        "registry.promotion.latency=false",
    )
    candidate, _ = evaluation(0.9)
    plain = gates_of(lax.registry.promotion, candidate, None, latency(), 0.95)
    assert REAL_WEIGHTS not in plain and blocking_gates(plain) == []
    gates = gates_of(lax.registry.promotion, candidate, None, latency(), 0.95, random_weights=True)
    assert list(gates)[-1] == REAL_WEIGHTS and blocking_gates(gates) == [REAL_WEIGHTS]
    assert gates_from_tags(gate_tags(gates))[REAL_WEIGHTS] == gates[REAL_WEIGHTS]
    assert may_promote(gate_tags(gates), force=False) == (False, [REAL_WEIGHTS])
    # The pipeline's decision: from the config, or from the export's spec under any config.
    systems = config(
        "policy.type=hub-vlm", "policy.preset=tiny", "policy.weights=random", ON_ESTIMATE
    )
    report, measured = cast(Any, candidate), cast(Any, latency())  # what the gates read of them
    assert blocking_gates(decide_gates(systems, report, None, measured)) == [REAL_WEIGHTS]
    from_spec = decide_gates(lax, report, None, measured, random_weights=True)
    assert blocking_gates(from_spec) == [REAL_WEIGHTS]


def at_delay(
    success: float | None,
    ci95: tuple[float, float] | None,
    vs_zero: bool | None = True,
    vs_champion: bool | None = None,
    refused: str = "",
) -> Any:
    """The evaluation at the target's delay (an ``AtDelay``): ``vs_zero`` / ``vs_champion``:
    whether each paired comparison passed (None: none)."""
    from stages.evaluate.at_delay import AtDelay

    def paired(passed: bool | None) -> Any:
        diff = -0.05 if passed else -0.3
        return (
            None
            if passed is None
            else SimpleNamespace(passed=passed, difference=diff, p_value=0.5 if passed else 0.001)
        )

    played = success is not None
    return AtDelay(
        target="t", mode="async", inference_ms=250.0, margin_ms=20.0, period_ms=100.0,
        ticks=3 if played or refused else 0,
        why="async, inference p99 250 ms + margin 20 ms = 3 ticks of 100 ms" if played else "none",
        success_rate=success, ci95=ci95, vs_zero=paired(vs_zero) if played else None,
        vs_champion=paired(vs_champion) if played else None,
        champion="v2" if vs_champion is not None else "", refused=refused,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("result", "passes"),
    [
        (at_delay(None, None), True),  # no delay at this target: nothing played
        (at_delay(0.9, (0.8, 0.95)), True),
        (at_delay(0.9, (0.8, 0.95), vs_champion=True), True),
        (at_delay(0.72, (0.6, 0.8)), False),  # under the bar at the delay
        (at_delay(0.9, (0.8, 0.95), vs_zero=False), False),  # worse than at zero delay
        (at_delay(0.9, (0.8, 0.95), vs_champion=False), False),  # worse than the champion
        (at_delay(None, None, refused="a chunk of 4 covers 2 ticks"), False),
    ],
)
def test_success_at_device_latency_needs_the_bar_and_neither_comparison_worse(
    result: Any, passes: bool
) -> None:
    gates = promotion_gates(config(), evaluation(0.9, ci95=(0.8, 0.95)), latency(), at=result)
    gate = gates["success at device latency"]
    assert gate.passed is passes and gate.enforced, gate
    assert blocking_gates(gates) == ([] if passes else ["success at device latency"])
    assert ">= 70% (lower end of the 95% CI) at the delay" in gate.required
    if result.played:
        assert "= 3 ticks of 100 ms" in gate.measured and "vs zero delay" in gate.measured
    if result.refused:
        assert result.refused in gate.measured
    off = promotion_gates(
        config("registry.promotion.at_latency=false"), evaluation(0.9, ci95=(0.8, 0.95)),
        latency(), at=result,
    )  # fmt: skip
    assert not blocking_gates(off), "unenforced: reported, not blocking"


def test_without_a_measurement_at_the_delay_there_is_no_such_gate() -> None:
    gates = promotion_gates(config(), evaluation(0.9, ci95=(0.8, 0.95)), latency())
    assert "success at device latency" not in gates
