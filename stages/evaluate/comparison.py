"""The paired comparison of a candidate with a baseline on the same seeds: its record and the
fixed-design gate.

    Comparison       = the 2x2 table's counts, exact McNemar's one-sided p-value against its
                       boundary, Newcombe's paired 95% interval for the difference, and where
                       (and why) the comparison stopped
    compare_outcomes = that record, once the plan of :mod:`stages.evaluate.sequential` decided
    compare_fixed    = the fixed design (one look, every seed) on (variant, seed index) outcomes
    compare          = the same on two finished evaluations (``EvalReport``)

The evaluate stage compares sequentially (:mod:`stages.evaluate.run`); the fixed design serves a
candidate compared again at promotion (``pipelines.registry.champion``). Rendering is
:mod:`stages.evaluate.report`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from robo_pipe.records import Record
from stages.evaluate.sequential import (
    PairedTable,
    decide,
    detectable,
    p_value,
    paired_table,
    plan_looks,
)
from stages.statistics import paired_difference_interval, wilson_interval

if TYPE_CHECKING:
    from stages.evaluate.sequential import Decision, SequentialPlan


@dataclass
class Comparison(Record):
    """Candidate against baseline on the same seeds: paired, and sequential when planned so
    (:mod:`stages.evaluate.sequential`)."""

    baseline: str
    baseline_success_rate: float
    """On the seeds the comparison used."""
    baseline_ci95: tuple[float, float]
    difference: float
    """Candidate minus baseline success rate on those seeds."""
    difference_ci95: tuple[float, float]
    """Newcombe's paired 95% interval for :attr:`difference`."""
    test: str
    """``exact McNemar`` (one-sided, on the discordant seeds), or with a margin ``Newcombe
    paired interval``."""
    concordant: dict[str, int]
    """Seeds both solved (``both``) and both failed (``neither``)."""
    discordant: dict[str, int]
    """Seeds only the candidate solved (``candidate_only``) and only the baseline solved
    (``baseline_only``): the evidence."""
    p_value: float
    """The nominal one-sided exact McNemar p-value on the discordant counts where the
    comparison stopped: small means the candidate is worse."""
    boundary: float
    """The nominal level that p-value was held against at that look (the configured error
    rate itself in a fixed design)."""
    confidence: float
    """1 - the false-block rate over all looks."""
    margin: float
    """Regressions up to this (success-rate points) were tolerated."""
    decision: str
    """``worse`` or ``not worse``."""
    reason: str
    """Why the comparison stopped where it did."""
    seeds: int
    """Seeds per variant both policies were compared on."""
    max_seeds: int
    """The plan's maximum (``evaluate.episodes``)."""
    look: int
    """The look (1-based) that decided."""
    looks: list[int]
    """The plan: seeds per variant at each look (one entry: the fixed design)."""
    detectable_regression: float
    """The smallest regression (success-rate points) a fixed test at the false-block rate on
    these seeds catches with 80% power, at the discordance observed: what "not worse" can
    vouch for (a sequential look's own boundary is stricter)."""
    passed: bool
    """False only when the candidate is worse (by more than the margin)."""
    baseline_reused: int = 0
    """Baseline episodes taken from its stored outcomes instead of being played again."""
    played_on: int = 0
    """Seeds per variant the candidate played alone after the comparison decided "not worse",
    while its held-out success was undecided against the success gate's bar."""

    @property
    def table(self) -> PairedTable:
        """The 2x2 table of the compared seeds."""
        return PairedTable(
            self.concordant["both"],
            self.discordant["candidate_only"],
            self.discordant["baseline_only"],
            self.concordant["neither"],
        )


def compare_outcomes(
    candidate: Mapping[tuple[str, int], bool],
    baseline: Mapping[tuple[str, int], bool],
    plan: SequentialPlan,
    look: int,
    verdict: tuple[Decision, str, float],
    baseline_name: str,
    baseline_reused: int = 0,
    played_on: int = 0,
) -> Comparison:
    """The comparison record of ``candidate`` and ``baseline`` outcomes ((variant, seed index)
    -> solved) on the seeds both played, decided at ``look`` of ``plan``: ``verdict`` is what
    :func:`~stages.evaluate.sequential.decide` said there (decision, why, block level);
    ``played_on``: see :attr:`Comparison.played_on`."""
    decision, reason, boundary = verdict
    if decision == "continue":
        raise ValueError("a comparison is recorded once it decided")
    table = paired_table(candidate, baseline)
    wins = table.both + table.baseline_only
    return Comparison(
        baseline=baseline_name,
        baseline_success_rate=wins / max(table.seeds, 1),
        baseline_ci95=wilson_interval(wins, table.seeds),
        difference=table.difference,
        difference_ci95=paired_difference_interval(
            table.both, table.candidate_only, table.baseline_only, table.neither, 0.95
        ),
        test="exact McNemar" if plan.margin <= 0 else "Newcombe paired interval",
        concordant={"both": table.both, "neither": table.neither},
        discordant={
            "candidate_only": table.candidate_only,
            "baseline_only": table.baseline_only,
        },
        p_value=p_value(table),
        boundary=boundary,
        confidence=1 - plan.false_block,
        margin=plan.margin,
        decision=decision,
        reason=reason,
        seeds=plan.looks[look],
        max_seeds=plan.looks[-1],
        look=look + 1,
        looks=plan.looks,
        detectable_regression=detectable(table, plan.false_block),
        passed=decision != "worse",
        baseline_reused=baseline_reused,
        played_on=played_on,
    )


def compare_fixed(
    candidate: Mapping[tuple[str, int], bool],
    baseline: Mapping[tuple[str, int], bool],
    seeds: int,
    confidence: float,
    margin: float,
    baseline_name: str,
) -> Comparison:
    """The fixed-design gate on outcomes ((variant, seed index) -> solved): is the candidate
    worse on its ``seeds`` seeds per variant? The baseline must have played every one."""
    if not candidate.keys() <= baseline.keys():
        raise ValueError("candidate and baseline were not evaluated on the same suite and seeds")
    theirs = {k: baseline[k] for k in candidate}
    plan = plan_looks(seeds, 1, 1 - confidence, 0.2, max(margin, 0.05), margin, "pocock")
    verdict = decide(plan, [paired_table(candidate, theirs)])
    return compare_outcomes(candidate, theirs, plan, 0, verdict, baseline_name)


class SuiteRow(Protocol):
    """A row of a finished evaluation (a ``VariantRow``): the scene variant it is about."""

    @property
    def variant(self) -> str:
        """The variant's name."""


class SuiteOutcomes(Protocol):
    """What :func:`compare` reads of a finished evaluation (an ``EvalReport``)."""

    @property
    def policy(self) -> str:
        """The policy evaluated (its path or registered name)."""

    @property
    def rows(self) -> Sequence[SuiteRow]:
        """One per variant, in the suite's order."""

    @property
    def seeds(self) -> list[int]:
        """The seeds played, the same for every variant."""

    def successes_by_episode(self) -> dict[tuple[str, int], bool]:
        """(variant, seed index) -> success."""


def compare(
    candidate: SuiteOutcomes, baseline: SuiteOutcomes, confidence: float, margin: float = 0.0
) -> Comparison:
    """The fixed-design gate on two finished reports: is the candidate worse than the baseline
    on the candidate's seeds (the baseline must have played every one of them)?"""
    if [r.variant for r in candidate.rows] != [r.variant for r in baseline.rows] or (
        baseline.seeds[: len(candidate.seeds)] != candidate.seeds
    ):
        raise ValueError("candidate and baseline were not evaluated on the same suite and seeds")
    return compare_fixed(
        candidate.successes_by_episode(),
        baseline.successes_by_episode(),
        len(candidate.seeds),
        confidence,
        margin,
        baseline.policy,
    )
