"""Comparing a candidate with a baseline on shared seeds: paired, and sequential.

    table    = the seeds both policies played, by outcome: both solved, candidate only,
               baseline only, both failed (only the two discordant cells carry evidence)
    test     = exact McNemar on the discordant seeds (one-sided: is the candidate worse?);
               with a margin, Newcombe's paired interval against ``-margin`` instead
    plan     = looks after batches of seeds and the error-spending rules, declared before the
               first batch: at look k the candidate is "worse" if its exact McNemar p-value
               is at or below the block level (the false-block rate spent exactly given the
               discordant counts seen so far: :func:`block_level`),
               "not worse" if the paired interval rules out a regression of ``regression``
               at ``pass_levels[k]`` (the miss rate, spent over the looks), else the next
               batch is played; the last look decides "worse" or "not worse" on the block
               level alone
success  = after "not worse" the candidate alone plays on, batch by batch, while the held-out
           success gate's bar lies inside its 95% interval (:func:`success_undecided`): the
           comparison needs fewer seeds than the gate's bar may

Both error rates hold over all looks together, whichever look stops (Lan-DeMets spending,
Pocock- or O'Brien-Fleming-type). ``looks: 1`` is the fixed design: every seed, one test.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from robo_pipe.records import Record
from stages.statistics import (
    detectable_regression,
    mcnemar_p_value,
    nominal_levels,
    paired_difference_interval,
    spent,
    wilson_interval,
)

Decision = Literal["worse", "not worse", "continue"]


@dataclass(frozen=True)
class PairedTable(Record):
    """Outcomes of two policies on the same seeds."""

    both: int
    candidate_only: int
    """Seeds the candidate solved and the baseline failed."""
    baseline_only: int
    """Seeds the baseline solved and the candidate failed."""
    neither: int

    @property
    def seeds(self) -> int:
        """Seeds in the table."""
        return self.both + self.candidate_only + self.baseline_only + self.neither

    @property
    def discordant(self) -> int:
        """Seeds with different outcomes: the only ones that tell the policies apart."""
        return self.candidate_only + self.baseline_only

    @property
    def difference(self) -> float:
        """Candidate minus baseline success rate on these seeds (0..1 points)."""
        return (self.candidate_only - self.baseline_only) / max(self.seeds, 1)


def paired_table(
    candidate: Mapping[tuple[str, int], bool], baseline: Mapping[tuple[str, int], bool]
) -> PairedTable:
    """The 2x2 table of the episodes (variant, seed index) both policies played."""
    shared = candidate.keys() & baseline.keys()
    cells = [(candidate[k], baseline[k]) for k in shared]
    return PairedTable(
        both=sum(c and b for c, b in cells),
        candidate_only=sum(c and not b for c, b in cells),
        baseline_only=sum(b and not c for c, b in cells),
        neither=sum(not (c or b) for c, b in cells),
    )


@dataclass(frozen=True)
class SequentialPlan(Record):
    """The looks and their boundaries, fixed before the first batch."""

    looks: list[int]
    """Seeds per variant played by each look (cumulative; the last is the maximum)."""
    block_levels: list[float]
    """Per look, with a margin: "worse" when the one-sided interval at this level puts the
    difference below ``-margin`` (normal-theory Lan-DeMets levels). Without a margin the
    exact McNemar p-value is held against :func:`block_level` instead."""
    pass_levels: list[float]
    """Per look: "not worse" when the one-sided interval at this level rules out a
    regression of :attr:`regression` (unused at the last look)."""
    false_block: float
    """Chance of blocking a candidate as good as the baseline, over all looks."""
    miss: float
    """Chance of passing a candidate :attr:`regression` worse, over all looks (when the
    maximum is large enough for it: see the report's detectable regression)."""
    regression: float
    """The regression (success-rate points, 0..1) the plan must not miss."""
    margin: float
    """Regressions up to this (success-rate points, 0..1) are tolerated."""
    spending: str


def plan_looks(
    max_seeds: int,
    looks: int,
    false_block: float,
    miss: float,
    regression: float,
    margin: float,
    spending: str,
) -> SequentialPlan:
    """Up to ``looks`` equally spaced looks over ``max_seeds`` seeds per variant (fewer when
    there are fewer seeds than looks); ``looks=1`` is the fixed design."""
    count = max(1, min(looks, max_seeds))
    seeds = sorted({round(max_seeds * (k + 1) / count) for k in range(count)})
    fractions = [n / max_seeds for n in seeds]
    return SequentialPlan(
        looks=seeds,
        block_levels=nominal_levels(false_block, fractions, spending),
        pass_levels=nominal_levels(miss, fractions, spending),
        false_block=false_block,
        miss=miss,
        regression=regression,
        margin=margin,
        spending=spending,
    )


def p_value(table: PairedTable) -> float:
    """The nominal one-sided exact McNemar p-value: small means the candidate is worse."""
    return mcnemar_p_value(table.candidate_only, table.baseline_only)


def is_worse(table: PairedTable, level: float, margin: float) -> bool:
    """Whether the candidate is worse than the baseline (by more than ``margin``) at one-sided
    ``level``: exact McNemar without a margin, else the upper end of Newcombe's interval for
    the difference below ``-margin``."""
    if margin <= 0:
        return p_value(table) <= level
    return _interval(table, level)[1] < -margin


def rules_out(table: PairedTable, level: float, regression: float) -> bool:
    """Whether a regression of ``regression`` or more is ruled out at one-sided ``level``
    (the lower end of Newcombe's interval for the difference above ``-regression``)."""
    return _interval(table, level)[0] > -regression


def block_level(plan: SequentialPlan, history: list[PairedTable]) -> float:
    """The nominal level the exact McNemar p-value is held against at look ``len(history)``
    (1-based), given the tables of every look so far (cumulative).

    Without a margin the false-block rate is spent exactly, conditionally on the discordant
    counts: when the policies are equally good, each discordant seed is a fair coin whichever
    seeds were discordant, so the null distribution of the baseline's wins among them, over
    the runs still going, is known exactly given how many seeds were discordant at each look.
    At each look the critical count is the smallest whose tail mass is within what the
    spending function allows by this look's share of the maximum seeds, less what earlier
    looks spent (discreteness slack carries forward); runs that stopped earlier (blocked, or
    passed: passes are binding, the gate acts on them) leave the distribution. So the level
    depends on the discordant and tied counts seen, never on which policy won, and it may
    rise or fall from look to look; it never exceeds ``false_block``. With a margin the
    normal-theory level :attr:`SequentialPlan.block_levels` applies.

    Raises:
        ValueError: an empty history, more looks than planned, or discordant counts that
            shrink from one look to the next (the tables are not cumulative)."""
    from scipy.stats import binom

    look = len(history) - 1
    if not 0 <= look < len(plan.looks):
        raise ValueError(f"a history of {len(history)} looks for a plan of {len(plan.looks)}")
    counts = [t.discordant for t in history]
    if any(b < a for a, b in itertools.pairwise(counts)):
        raise ValueError(f"discordant counts must not shrink between looks: {counts}")
    if plan.margin > 0:
        return plan.block_levels[look]
    if len(plan.looks) == 1:
        return plan.false_block  # the fixed design: the exact test at the whole level
    alive = np.ones(1)  # P(baseline wins b of the discordant seeds, still running) under "equal"
    used, before = 0.0, 0
    for k, table in enumerate(history):
        d = table.discordant
        alive = np.convolve(alive, binom.pmf(np.arange(d - before + 1), d - before, 0.5))
        tail = np.append(np.cumsum(alive[::-1])[::-1], 0.0)  # [c] = P(b >= c, still running)
        allowed = spent(plan.false_block, plan.looks[k] / plan.looks[-1], plan.spending) - used
        critical = int(np.argmax(tail <= allowed + 1e-12))
        alone = binom.sf(np.arange(d + 1) - 1, d, 0.5)  # [c] = P(b >= c) for this look alone
        critical = max(critical, int(np.sum(alone > plan.false_block)))
        if k == look:
            return float(binom.sf(critical - 1, d, 0.5)) if critical <= d else 0.0
        used += float(tail[critical])
        alive = alive.copy()
        alive[critical:] = 0.0
        for b in range(d + 1):  # runs that passed here stop
            if rules_out(
                PairedTable(table.both, d - b, b, table.neither),
                plan.pass_levels[k],
                plan.regression,
            ):
                alive[b] = 0.0
        before = d
    raise AssertionError("unreachable: the loop returns at the last table")


def decide(plan: SequentialPlan, history: list[PairedTable]) -> tuple[Decision, str, float]:
    """The decision at look ``len(history)`` on the cumulative tables of every look so far,
    why, and the block level the p-value was held against (:func:`block_level`)."""
    look, table = len(history) - 1, history[-1]
    block = block_level(plan, history)
    if is_worse(table, block, plan.margin):
        against = "p" if plan.margin <= 0 else f"the interval's upper end vs -{plan.margin:.1%}"
        why = f"{against} crossed the block boundary ({block:.4g}) at look {look + 1}"
        return "worse", why, block
    if look == len(plan.looks) - 1:
        return "not worse", f"reached the maximum ({plan.looks[-1]} seeds per variant)", block
    level = plan.pass_levels[look]
    if rules_out(table, level, plan.regression):
        why = (
            f"a {plan.regression:.0%} regression ruled out (pass boundary {level:.4g}) "
            f"at look {look + 1}"
        )
        return "not worse", why, block
    return "continue", "", block


def success_undecided(wins: int, episodes: int, bar: float | None) -> bool:
    """Whether the held-out success gate could still go either way: ``bar`` (its
    ``min_success``) lies inside the 95% Wilson interval of ``wins`` of ``episodes``, so more
    episodes are needed before its lower end clears the bar or its upper end falls below
    it. False without a bar."""
    if bar is None:
        return False
    low, high = wilson_interval(wins, episodes)
    return low < bar <= high


def detectable(table: PairedTable, level: float, power: float = 0.8) -> float:
    """The smallest regression (0..1 points) a test at ``level`` on this table's seeds would
    catch with ``power``, at the discordance it observed."""
    discordance = table.discordant / max(table.seeds, 1)
    return detectable_regression(table.seeds, discordance, level, power)


def _interval(table: PairedTable, level: float) -> tuple[float, float]:
    return paired_difference_interval(
        table.both, table.candidate_only, table.baseline_only, table.neither, 1 - 2 * level
    )


def encode_outcomes(outcomes: Mapping[tuple[str, int], bool]) -> dict[str, str]:
    """Outcomes ((variant, seed index) -> solved) as one string per variant, a character per
    seed index from 0: ``1`` solved, ``0`` failed, ``-`` not played. Compact enough for a
    registry tag (5,000 characters: seeds beyond that are not stored)."""
    encoded: dict[str, list[str]] = {}
    for (variant, index), solved in outcomes.items():
        chars = encoded.setdefault(variant, [])
        chars.extend("-" * (index + 1 - len(chars)))
        chars[index] = "1" if solved else "0"
    return {variant: "".join(chars) for variant, chars in sorted(encoded.items())}


def decode_outcomes(encoded: Mapping[str, str]) -> dict[tuple[str, int], bool]:
    """The outcomes :func:`encode_outcomes` wrote (unplayed seeds left out)."""
    return {
        (variant, index): char == "1"
        for variant, chars in encoded.items()
        for index, char in enumerate(chars)
        if char in "01"
    }
