"""The paired, sequential comparison of a candidate with its baseline (issue 24): the issue's
worked example, identical policies, looks and boundaries, and simulated sequential runs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from stages.evaluate.sequential import (
    Decision,
    PairedTable,
    SequentialPlan,
    decide,
    detectable,
    is_worse,
    p_value,
    paired_table,
    plan_looks,
    rules_out,
)
from stages.statistics import detectable_regression, two_proportion_test

ISSUE = PairedTable(both=144, candidate_only=4, baseline_only=16, neither=36)
"""200 shared seeds: the champion solves 160, the candidate 148 (16 lost, 4 won)."""


def fixed(max_seeds: int = 200) -> SequentialPlan:
    """One look at every seed: the fixed design at one-sided 0.05."""
    return plan_looks(max_seeds, 1, 0.05, 0.2, 0.05, 0.0, "pocock")


def play(plan: SequentialPlan, cells: list[float], seed: int) -> tuple[Decision, int]:
    """A sequential comparison on simulated paired outcomes: each seed lands in (both,
    candidate only, baseline only, neither) with probabilities ``cells``; returns the decision
    and the seeds played when it was taken."""
    draws = np.random.default_rng(seed).choice(4, size=plan.looks[-1], p=cells)
    for look, seeds in enumerate(plan.looks):
        table = PairedTable(*(int(c) for c in np.bincount(draws[:seeds], minlength=4)))
        decision, reason = decide(plan, look, table)
        if decision != "continue":
            assert reason
            return decision, seeds
    raise AssertionError("no decision at the last look")


def test_issue_example_the_fixed_paired_plan_blocks() -> None:
    assert (ISSUE.seeds, ISSUE.discordant) == (200, 20)
    assert ISSUE.difference == pytest.approx(-0.06)
    # the old pooled gate lets it through ...
    assert two_proportion_test(148, 200, 160, 200)[2] == pytest.approx(0.077, abs=1e-3)
    # ... the paired one does not
    plan = fixed()
    assert plan.looks == [200]
    assert plan.block_levels == pytest.approx([0.05], abs=1e-9)
    assert p_value(ISSUE) == pytest.approx(0.0059, abs=1e-4)
    decision, reason = decide(plan, 0, ISSUE)
    assert decision == "worse"
    assert "block boundary" in reason and "look 1" in reason
    assert is_worse(ISSUE, 0.05, 0.0)
    assert not is_worse(ISSUE, 0.005, 0.0)  # p = 0.0059


def test_identical_outcomes_pass() -> None:
    same = PairedTable(both=160, candidate_only=0, baseline_only=0, neither=40)
    assert p_value(same) == 1.0
    decision, reason = decide(fixed(), 0, same)
    assert decision == "not worse"
    assert "reached the maximum (200 seeds per variant)" in reason
    # sequentially: the last look decides, an earlier one too once a regression is ruled out
    plan = plan_looks(200, 4, 0.05, 0.2, 0.05, 0.0, "pocock")
    assert decide(plan, 3, same)[0] == "not worse"
    assert decide(plan, 0, PairedTable(40, 0, 0, 10))[0] == "not worse"


def test_margin_tolerates_small_regressions() -> None:
    # the issue's table: 90% interval for the difference about [-0.098, -0.023]
    assert is_worse(ISSUE, 0.05, 0.01)
    assert not is_worse(ISSUE, 0.05, 0.10)
    plan = plan_looks(200, 1, 0.05, 0.2, 0.05, 0.10, "pocock")
    decision, reason = decide(plan, 0, ISSUE)
    assert decision == "not worse"
    assert "reached the maximum" in reason


def test_rules_out_a_regression() -> None:
    assert rules_out(PairedTable(160, 0, 0, 40), 0.05, 0.05)
    assert not rules_out(ISSUE, 0.05, 0.05)  # -0.06 observed
    assert rules_out(ISSUE, 0.05, 0.12)
    # equal rates, few seeds: the interval is too wide to rule out 5 points
    assert not rules_out(PairedTable(14, 3, 3, 0), 0.05, 0.05)


def test_paired_table_counts_shared_seeds_only() -> None:
    candidate = {("a", 0): True, ("a", 1): True, ("a", 2): False, ("b", 0): False, ("b", 9): True}
    baseline = {("a", 0): True, ("a", 1): False, ("a", 2): True, ("b", 0): False, ("c", 0): True}
    table = paired_table(candidate, baseline)
    assert table == PairedTable(both=1, candidate_only=1, baseline_only=1, neither=1)
    assert table.seeds == 4 and table.discordant == 2 and table.difference == 0.0
    assert paired_table({}, baseline).seeds == 0
    assert PairedTable(0, 0, 0, 0).difference == 0.0


def test_plan_looks_are_equally_spaced_and_end_at_the_maximum() -> None:
    plan = plan_looks(200, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    assert plan.looks == list(range(20, 201, 20))
    assert len(plan.block_levels) == len(plan.pass_levels) == 10
    # the looks share the error rates: every nominal level below the total
    assert max(plan.block_levels) < 0.05 and max(plan.pass_levels) < 0.2
    uneven = plan_looks(25, 10, 0.05, 0.2, 0.05, 0.0, "obrien-fleming")
    assert uneven.looks[-1] == 25 and len(uneven.looks) == 10
    assert all(b > a for a, b in itertools.pairwise(uneven.looks))


def test_plan_looks_with_fewer_seeds_than_looks() -> None:
    plan = plan_looks(3, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    assert plan.looks == [1, 2, 3]
    assert len(plan.block_levels) == len(plan.pass_levels) == 3
    one = plan_looks(1, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    assert one.looks == [1]
    assert one.block_levels == pytest.approx([0.05], abs=1e-9)


def test_a_clear_regression_stops_early() -> None:
    """Candidate 50% against a champion at 90%, independent outcomes per seed."""
    plan = plan_looks(200, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    cells = [0.45, 0.05, 0.45, 0.05]
    runs = [play(plan, cells, seed) for seed in range(20)]
    assert {decision for decision, _ in runs} == {"worse"}
    assert max(seeds for _, seeds in runs) < 200
    assert np.mean([seeds for _, seeds in runs]) <= 60


def test_a_clear_equal_stops_early() -> None:
    plan = plan_looks(1000, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    # identical policies: no discordant seed, a 5-point regression ruled out at the first look
    assert [play(plan, [0.8, 0.0, 0.0, 0.2], seed) for seed in range(3)] == [("not worse", 100)] * 3
    # equal rates, 4% of the seeds discordant
    runs = [play(plan, [0.78, 0.02, 0.02, 0.18], seed) for seed in range(10)]
    assert {decision for decision, _ in runs} == {"not worse"}
    assert max(seeds for _, seeds in runs) < 1000


def test_never_beyond_the_maximum() -> None:
    plan = plan_looks(200, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    # borderline: a 3-point regression, not blocked and not ruled out half-way ...
    half = PairedTable(70, 5, 8, 17)
    assert decide(plan, 4, half) == ("continue", "")
    # ... the same at the maximum decides
    decision, reason = decide(plan, 9, PairedTable(140, 10, 16, 34))
    assert decision == "not worse" and "reached the maximum" in reason
    # the last look never continues, whatever the table
    for candidate_only in range(0, 41, 4):
        for baseline_only in range(0, 41, 4):
            table = PairedTable(
                120, candidate_only, baseline_only, 80 - candidate_only - baseline_only
            )
            assert decide(plan, 9, table)[0] in ("worse", "not worse")
    # simulated borderline runs (a 3-point regression) stop at a look, never past the maximum
    for seed in range(10):
        decision, seeds = play(plan, [0.71, 0.045, 0.075, 0.17], seed)
        assert seeds in plan.looks and decision in ("worse", "not worse")


def test_detectable_uses_the_observed_discordance() -> None:
    assert detectable(ISSUE, 0.05) == pytest.approx(detectable_regression(200, 0.1, 0.05, 0.8))
    assert detectable(ISSUE, 0.05, 0.9) > detectable(ISSUE, 0.05)
    assert detectable(PairedTable(0, 0, 0, 0), 0.05) == 1.0
