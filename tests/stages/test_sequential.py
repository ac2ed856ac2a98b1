"""The paired, sequential comparison of a candidate with its baseline (issue 24): the issue's
worked example, identical policies, looks and boundaries, the block level spent on the
discordant seeds of the looks so far, and simulated sequential runs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from stages.evaluate.sequential import (
    Decision,
    PairedTable,
    SequentialPlan,
    block_level,
    decide,
    detectable,
    is_worse,
    p_value,
    paired_table,
    plan_looks,
    rules_out,
    success_undecided,
)
from stages.statistics import detectable_regression, two_proportion_test

ISSUE = PairedTable(both=144, candidate_only=4, baseline_only=16, neither=36)
"""200 shared seeds: the champion solves 160, the candidate 148 (16 lost, 4 won)."""


def fixed(max_seeds: int = 200) -> SequentialPlan:
    """One look at every seed: the fixed design at one-sided 0.05."""
    return plan_looks(max_seeds, 1, 0.05, 0.2, 0.05, 0.0, "pocock")


def grown(table: PairedTable, looks: list[int]) -> list[PairedTable]:
    """The history of a run that ends at ``table``: cumulative tables at ``looks`` (the last
    one ``table``'s seeds) whose four cells grow in proportion."""
    assert looks[-1] == table.seeds
    counts = [table.both, table.candidate_only, table.baseline_only, table.neither]
    order = sorted(((j + 0.5) / n, cell) for cell, n in enumerate(counts) for j in range(n))
    seeds = [cell for _, cell in order]
    return [PairedTable(*(int(c) for c in np.bincount(seeds[:n], minlength=4))) for n in looks]


def play(plan: SequentialPlan, cells: list[float], seed: int) -> tuple[Decision, int]:
    """A sequential comparison on simulated paired outcomes: each seed lands in (both,
    candidate only, baseline only, neither) with probabilities ``cells``; returns the decision
    and the seeds played when it was taken."""
    draws = np.random.default_rng(seed).choice(4, size=plan.looks[-1], p=cells)
    history: list[PairedTable] = []
    for seeds in plan.looks:
        history.append(PairedTable(*(int(c) for c in np.bincount(draws[:seeds], minlength=4))))
        decision, reason, block = decide(plan, history)
        assert 0.0 <= block <= plan.false_block
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
    decision, reason, block = decide(plan, [ISSUE])
    assert decision == "worse"
    assert block == 0.05  # the fixed design: the exact test at the whole level
    assert "block boundary (0.05)" in reason and "look 1" in reason
    assert is_worse(ISSUE, 0.05, 0.0)
    assert not is_worse(ISSUE, 0.005, 0.0)  # p = 0.0059


def test_identical_outcomes_pass() -> None:
    same = PairedTable(both=160, candidate_only=0, baseline_only=0, neither=40)
    assert p_value(same) == 1.0
    decision, reason, _ = decide(fixed(), [same])
    assert decision == "not worse"
    assert "reached the maximum (200 seeds per variant)" in reason
    # sequentially: the last look decides, an earlier one too once a regression is ruled out
    plan = plan_looks(200, 4, 0.05, 0.2, 0.05, 0.0, "pocock")
    assert decide(plan, grown(same, plan.looks))[0] == "not worse"
    decision, reason, _ = decide(plan, [PairedTable(40, 0, 0, 10)])
    assert decision == "not worse" and "ruled out" in reason and "look 1" in reason


def test_margin_tolerates_small_regressions() -> None:
    # the issue's table: 90% interval for the difference about [-0.098, -0.023]
    assert is_worse(ISSUE, 0.05, 0.01)
    assert not is_worse(ISSUE, 0.05, 0.10)
    plan = plan_looks(200, 1, 0.05, 0.2, 0.05, 0.10, "pocock")
    decision, reason, block = decide(plan, [ISSUE])
    assert decision == "not worse"
    assert "reached the maximum" in reason
    assert block == plan.block_levels[0]
    # with a margin the normal-theory levels of the plan apply, whatever the history
    plan = plan_looks(200, 4, 0.05, 0.2, 0.05, 0.01, "pocock")
    history = grown(ISSUE, plan.looks)
    for look in range(4):
        assert block_level(plan, history[: look + 1]) == plan.block_levels[look]
    decision, reason, block = decide(plan, history)
    assert decision == "worse" and "-1.0%" in reason and block == plan.block_levels[3]


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
    half = grown(PairedTable(70, 5, 8, 17), plan.looks[:5])
    for look in range(1, 6):
        assert decide(plan, half[:look])[:2] == ("continue", "")
    # ... the same at the maximum decides
    decision, reason, _ = decide(plan, grown(PairedTable(140, 10, 16, 34), plan.looks))
    assert decision == "not worse" and "reached the maximum" in reason
    # the last look never continues, whatever the table
    for candidate_only in range(0, 41, 8):
        for baseline_only in range(0, 41, 8):
            table = PairedTable(
                120, candidate_only, baseline_only, 80 - candidate_only - baseline_only
            )
            assert decide(plan, grown(table, plan.looks))[0] in ("worse", "not worse")
    # simulated borderline runs (a 3-point regression) stop at a look, never past the maximum
    for seed in range(10):
        decision, seeds = play(plan, [0.71, 0.045, 0.075, 0.17], seed)
        assert seeds in plan.looks and decision in ("worse", "not worse")


def test_detectable_uses_the_observed_discordance() -> None:
    assert detectable(ISSUE, 0.05) == pytest.approx(detectable_regression(200, 0.1, 0.05, 0.8))
    assert detectable(ISSUE, 0.05, 0.9) > detectable(ISSUE, 0.05)
    assert detectable(PairedTable(0, 0, 0, 0), 0.05) == 1.0


def test_the_success_gate_is_undecided_while_its_bar_is_inside_the_95_interval() -> None:
    # 0/12: Wilson 95% upper end 3.84 / 15.84 = 0.2425; 19/20: lower end 0.7639
    assert success_undecided(0, 12, 0.2) and not success_undecided(0, 12, 0.25)
    assert not success_undecided(0, 36, 0.1), "0/36 reaches 0.0964 at most: below the bar"
    assert success_undecided(19, 20, 0.77) and not success_undecided(19, 20, 0.76)
    assert not success_undecided(0, 12, None) and not success_undecided(5, 12, 0.0)


def test_block_level_of_a_one_look_plan_is_the_false_block_rate() -> None:
    tables = [ISSUE, PairedTable(160, 0, 0, 40), PairedTable(0, 100, 100, 0)]
    for false_block in (0.01, 0.05, 0.1):
        plan = plan_looks(200, 1, false_block, 0.2, 0.05, 0.0, "pocock")
        for table in tables:
            assert block_level(plan, [table]) == false_block
    # one seed: one look, whatever the number of looks asked for
    plan = plan_looks(1, 10, 0.05, 0.2, 0.05, 0.0, "obrien-fleming")
    assert block_level(plan, [PairedTable(0, 0, 1, 0)]) == 0.05


def test_block_level_never_exceeds_the_false_block_rate() -> None:
    """Simulated histories, from no discordant seed to half of them, regressions and
    improvements, both spending functions: every look's level is an exact McNemar level (a
    binomial tail on this look's discordant seeds) within ``false_block``, however much of it
    earlier looks left unspent."""
    rng = np.random.default_rng(3)
    highest = 0.0
    for spending, looks, false_block in (
        ("pocock", 10, 0.05),
        ("obrien-fleming", 10, 0.05),
        ("pocock", 5, 0.1),
        ("obrien-fleming", 20, 0.1),
    ):
        plan = plan_looks(200, looks, false_block, 0.2, 0.05, 0.0, spending)
        for discordance, share in ((0.0, 0.5), (0.06, 0.5), (0.12, 0.5), (0.5, 0.4), (0.2, 0.9)):
            both = (1 - discordance) * 0.8
            cells = [both, discordance * share, discordance * (1 - share), 1 - discordance - both]
            batches = rng.multinomial(200 // looks, cells, size=looks)
            history = [PairedTable(*(int(c) for c in row)) for row in batches.cumsum(axis=0)]
            for look in range(1, looks + 1):
                level = block_level(plan, history[:look])
                assert 0.0 <= level <= false_block
                d = history[look - 1].discordant
                exact = {p_value(PairedTable(0, d - b, b, 0)) for b in range(d + 1)}
                assert level == 0.0 or min(abs(level - e) for e in exact) < 1e-12
                highest = max(highest, level / false_block)
    assert highest > 0.5  # and not trivially small


def histories(batches: np.ndarray, wins: np.ndarray) -> list[list[PairedTable]]:
    """The cumulative tables, look by look, of runs that share their tied and discordant
    counts (``batches``: the both, neither and discordant seeds of each look's batch) and
    differ in who won the discordant seeds (``wins``: the baseline's, cumulative, a row per
    run)."""
    both, neither, discordant = batches.cumsum(axis=0).T.tolist()
    return [
        [PairedTable(both[k], discordant[k] - b, b, neither[k]) for k, b in enumerate(row)]
        for row in wins.cumsum(axis=1).tolist()
    ]


def test_equal_policies_are_blocked_within_the_false_block_rate_over_all_looks() -> None:
    """4,000 sequential runs of two equally good policies (10 looks over 400 seeds, 12% of
    them discordant, the gate's 5%): blocked at some look at most 5% of the time, within 3
    Monte-Carlo standard errors; spending the whole 5% at every look, on the same runs,
    blocks far more often (the check can fail).

    The runs share 20 paths of tied and discordant counts (200 runs each, drawn like the
    seeds of equal policies: a seed is discordant with probability 0.12, and then won by
    either with probability 1/2): the block level depends on those counts only (see
    :func:`test_block_level_depends_only_on_the_tied_and_discordant_counts`), so each path's
    levels are computed once, on its first run, and :func:`decide` is checked against them
    on the first two runs of every path."""
    plan = plan_looks(400, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    rng = np.random.default_rng(24)
    paths, runs = 20, 200
    verdicts: dict[tuple[int, PairedTable, float], Decision] = {}

    def verdict(look: int, table: PairedTable, level: float) -> Decision:
        """What :func:`decide` says at ``look`` on ``table`` when the block level is ``level``."""
        key = (look, table, level)
        if key not in verdicts:
            if is_worse(table, level, plan.margin):
                verdicts[key] = "worse"
            elif look == 9 or rules_out(table, plan.pass_levels[look], plan.regression):
                verdicts[key] = "not worse"
            else:
                verdicts[key] = "continue"
        return verdicts[key]

    blocked = {"spent": 0, "whole level at every look": 0}
    for _ in range(paths):
        batches = rng.multinomial(40, [0.74, 0.14, 0.12], size=10)  # both, neither, discordant
        tables = histories(batches, rng.binomial(batches[:, 2], 0.5, size=(runs, 10)))
        spent = [block_level(plan, tables[0][: look + 1]) for look in range(10)]
        assert max(spent) <= plan.false_block
        for run, history in enumerate(tables):
            for rule, levels in (
                ("spent", spent),
                ("whole level at every look", [plan.false_block] * 10),
            ):
                for look, table in enumerate(history):
                    decision = verdict(look, table, levels[look])
                    if run < 2 and rule == "spent":
                        got, _, level = decide(plan, history[: look + 1])
                        assert (got, level) == (decision, spent[look])
                    if decision != "continue":
                        blocked[rule] += decision == "worse"
                        break
    total = paths * runs
    bound = plan.false_block + 3 * math.sqrt(plan.false_block * (1 - plan.false_block) / total)
    assert plan.false_block / 2 < blocked["spent"] / total <= bound
    assert blocked["whole level at every look"] / total > bound


def test_block_level_depends_only_on_the_tied_and_discordant_counts() -> None:
    """Who won the discordant seeds (of earlier looks, or of this one) does not move the
    level: under equal policies they are fair coins whoever wins them. How many seeds were
    discordant, and tied (the pass regions of earlier looks), does."""
    plan = plan_looks(200, 10, 0.05, 0.2, 0.05, 0.0, "pocock")
    rng = np.random.default_rng(11)
    batches = rng.multinomial(20, [0.7, 0.15, 0.15], size=10)  # both, neither, discordant
    wins = np.stack([rng.binomial(batches[:, 2], share) for share in (0.5, 0.1, 0.9)])
    original, *others = histories(batches, wins)  # wins: the baseline's, batch by batch
    moved = 0  # looks whose table the swap changed
    for look in range(1, 11):
        level = block_level(plan, original[:look])
        # the earlier looks' discordant seeds won by the other policy, this look's kept
        earlier = wins[0].copy()
        earlier[: look - 1] = batches[: look - 1, 2] - wins[0, : look - 1]
        [swapped] = histories(batches, earlier[None])
        moved += swapped[look - 1] != original[look - 1]
        assert block_level(plan, swapped[:look]) == level
        # every discordant seed won by the other policy; other winners altogether
        mirrored = [
            PairedTable(t.both, t.baseline_only, t.candidate_only, t.neither) for t in original
        ]
        assert block_level(plan, mirrored[:look]) == level
        for other in others:
            assert block_level(plan, other[:look]) == level
    assert moved >= 5
    # the counts do matter: more discordant seeds at the last look, or other tied counts earlier
    last = original[-1]
    more = PairedTable(
        last.both - 10, last.candidate_only + 5, last.baseline_only + 5, last.neither
    )
    assert block_level(plan, [*original[:-1], more]) != block_level(plan, original)
    ties = [  # 10 seeds both failed instead of both solved
        PairedTable(t.both - 10, t.candidate_only, t.baseline_only, t.neither + 10)
        for t in original
    ]
    assert [block_level(plan, ties[:k]) for k in range(1, 11)] != [
        block_level(plan, original[:k]) for k in range(1, 11)
    ]


def test_block_level_refuses_histories_that_do_not_fit_the_plan() -> None:
    plan = plan_looks(40, 4, 0.05, 0.2, 0.05, 0.0, "pocock")
    table = PairedTable(5, 1, 2, 2)
    with pytest.raises(ValueError, match="a history of 0 looks"):
        block_level(plan, [])
    with pytest.raises(ValueError, match="a history of 5 looks"):
        block_level(plan, [table] * 5)
    with pytest.raises(ValueError, match="must not shrink"):
        block_level(plan, [table, PairedTable(8, 1, 0, 1)])
