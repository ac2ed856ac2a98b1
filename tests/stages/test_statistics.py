"""Wilson intervals, the two-proportion test, exact McNemar, Newcombe's paired interval, the
detectable regression and group-sequential boundaries against published and hand-worked values."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.stats import norm

from stages.statistics import (
    SPENDING,
    detectable_regression,
    mcnemar_p_value,
    nominal_levels,
    paired_difference_interval,
    spent,
    two_proportion_test,
    wilson_interval,
)


def test_wilson_interval_known_values() -> None:
    low, high = wilson_interval(50, 100)
    assert low == pytest.approx(0.4038, abs=1e-4)
    assert high == pytest.approx(0.5962, abs=1e-4)


@pytest.mark.parametrize(
    ("successes", "trials", "low", "high"),
    [
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_interval_matches_newcombe_1998(
    successes: int, trials: int, low: float, high: float
) -> None:
    """Newcombe, Statistics in Medicine 17 (1998) 857-872, table I, method 3 (score interval
    without continuity correction)."""
    assert wilson_interval(successes, trials) == pytest.approx((low, high), abs=1e-4)


def test_wilson_interval_edges_stay_in_unit_range() -> None:
    assert wilson_interval(0, 20)[0] == 0.0
    assert wilson_interval(20, 20)[1] == 1.0
    assert wilson_interval(20, 20)[0] == pytest.approx(0.8389, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    # one trial: z^2 / (1 + z^2) = 0.7935 is the upper bound after a failure
    assert wilson_interval(0, 1) == pytest.approx((0.0, 0.7935), abs=1e-4)
    assert wilson_interval(1, 1) == pytest.approx((0.2065, 1.0), abs=1e-4)
    with pytest.raises(ValueError, match=r"successes must be in \[0, 4\], got 5"):
        wilson_interval(5, 4)
    # every count: the interval holds the observed rate (float rounding once put 1.0 above the
    # upper bound at n = 4, 10, 14, ... and a negative error bar crashed the report plot)
    for n in range(1, 500):
        assert wilson_interval(n, n)[1] == 1.0 and wilson_interval(0, n)[0] == 0.0


def test_two_proportion_test_known_values() -> None:
    diff, z, p_worse = two_proportion_test(45, 100, 55, 100)
    assert diff == pytest.approx(-0.10)
    assert z == pytest.approx(-1.4142, abs=1e-4)  # pooled p = 0.5, se = sqrt(0.25 * 0.02)
    assert p_worse == pytest.approx(0.0786, abs=1e-4)
    assert two_proportion_test(30, 50, 30, 50) == (0.0, 0.0, 0.5)
    assert two_proportion_test(50, 50, 40, 40) == (0.0, 0.0, 0.5), "no variance: no evidence"
    assert two_proportion_test(0, 10, 0, 20) == (0.0, 0.0, 0.5)
    # one trial each is enough: pooled 0.5, se = sqrt(0.25 * 2) -> z = 1.4142
    assert two_proportion_test(1, 1, 0, 1) == pytest.approx((1.0, 1.4142, 0.9214), abs=1e-4)
    for empty in ((5, 0, 5, 10), (5, 10, 5, 0)):
        with pytest.raises(ValueError, match=r"^both samples need at least one trial$"):
            two_proportion_test(*empty)
    assert two_proportion_test(10, 200, 180, 200)[2] < 1e-6


# -- paired comparisons on shared seeds (issue 24) -------------------------------------------------

ISSUE_TABLE = {"both": 144, "candidate_only": 4, "baseline_only": 16, "neither": 36}
"""The issue's worked example: 200 shared seeds, the champion solves 160, the candidate 148;
the candidate fails 16 seeds the champion solved and solves 4 the champion failed."""


def test_issue_example_pooled_test_passes_and_mcnemar_blocks() -> None:
    both, candidate_only, baseline_only, _ = ISSUE_TABLE.values()
    assert both + candidate_only == 148 and both + baseline_only == 160
    # the old gate: pooled z = -0.06 / sqrt(0.77 * 0.23 * 2 / 200) = -1.4257 -> p = 0.077 > 0.05
    diff, z, p_pooled = two_proportion_test(148, 200, 160, 200)
    assert diff == pytest.approx(-0.06)
    assert z == pytest.approx(-1.4257, abs=1e-4)
    assert p_pooled == pytest.approx(0.0770, abs=1e-3)
    assert p_pooled > 0.05
    # paired: P(X <= 4) for X ~ Binomial(20, 1/2) = (1 + 20 + 190 + 1140 + 4845) / 2^20
    p_paired = mcnemar_p_value(candidate_only, baseline_only)
    assert p_paired == pytest.approx(6196 / 2**20, rel=1e-9)
    assert p_paired == pytest.approx(0.0059, abs=1e-4)
    assert p_paired < 0.05


def test_mcnemar_without_discordant_seeds_is_no_evidence() -> None:
    assert mcnemar_p_value(0, 0) == 1.0
    # the candidate won every discordant seed, or as many as it lost: nothing against it
    assert mcnemar_p_value(3, 0) == 1.0
    assert mcnemar_p_value(5, 5) == pytest.approx(0.6230, abs=1e-4)  # 638 / 1024
    # one-sided: a candidate that wins most discordant seeds is not "worse"
    assert mcnemar_p_value(16, 4) > 0.99
    assert mcnemar_p_value(0, 1) == 0.5
    assert mcnemar_p_value(0, 5) == pytest.approx(1 / 32)
    with pytest.raises(ValueError, match="discordant counts must be >= 0"):
        mcnemar_p_value(-1, 3)


@pytest.mark.parametrize(
    ("table", "p_paired", "p_pooled"),
    [
        # 20 seeds, the baseline solves 5, the candidate 1 (one of the baseline's): 4 discordant
        # seeds are too few for the exact test (1/16), the pooled test blocks
        ((1, 0, 4, 15), 0.0625, 0.0383),
        # negatively correlated outcomes (no seed solved by both): the paired variance is
        # larger than the pooled one, pairing loses
        ((0, 38, 50, 12), 0.1204, 0.0437),
    ],
)
def test_pooled_blocks_where_paired_does_not(
    table: tuple[int, int, int, int], p_paired: float, p_pooled: float
) -> None:
    """Pairing is not uniformly more powerful: honest cases where only the pooled test blocks."""
    both, candidate_only, baseline_only, _ = table
    n = sum(table)
    paired = mcnemar_p_value(candidate_only, baseline_only)
    pooled = two_proportion_test(both + candidate_only, n, both + baseline_only, n)[2]
    assert paired == pytest.approx(p_paired, abs=1e-4)
    assert pooled == pytest.approx(p_pooled, abs=1e-4)
    assert pooled < 0.05 < paired


def test_newcombe_interval_matches_fagerland_ch8() -> None:
    """Fagerland, Lydersen & Laake, Statistical Analysis of Contingency Tables (2017), ch. 8:
    the paired table [[59, 6], [16, 80]], Newcombe's hybrid score interval for p1+ - p+1
    (R package contingencytables, test-ch8.R)."""
    low, high = paired_difference_interval(59, 6, 16, 80)
    assert low == pytest.approx(-0.1186, abs=1e-4)
    assert high == pytest.approx(-0.0046, abs=1e-4)
    # the roles swapped: the interval is mirrored
    assert paired_difference_interval(59, 16, 6, 80) == pytest.approx((0.0046, 0.1186), abs=1e-4)
    # the issue's table: the whole 95% interval below zero, as McNemar says
    low, high = paired_difference_interval(**ISSUE_TABLE)
    assert low < -0.06 < high < 0
    # wider at higher confidence
    low99, high99 = paired_difference_interval(59, 6, 16, 80, confidence=0.99)
    assert low99 < -0.1186 and high99 > -0.0046


def test_newcombe_interval_edges() -> None:
    assert paired_difference_interval(0, 0, 0, 0) == (-1.0, 1.0)
    # identical outcomes: the difference is 0 and the interval holds it, narrower than the
    # same rates on independent samples would give
    low, high = paired_difference_interval(160, 0, 0, 40)
    assert low < 0 < high
    assert high - low < 0.05
    assert (
        paired_difference_interval(0, 0, 0, 30)[0]
        <= 0
        <= paired_difference_interval(0, 0, 0, 30)[1]
    )
    for table in ((0, 10, 0, 0), (0, 0, 10, 0), (5, 0, 0, 0)):
        low, high = paired_difference_interval(*table)
        assert -1.0 <= low <= high <= 1.0


# -- detectable regression -------------------------------------------------------------------------


def test_detectable_regression_matches_the_normal_closed_form() -> None:
    """n d - z_a sqrt(n r) = z_b sqrt(n (r - d^2)), squared: with A = z_a sqrt(r / n) and
    k = 1 + z_b^2 / n, k d^2 - 2 A d + A^2 - z_b^2 r / n = 0, the larger root."""
    seeds, discordance, level, power = 200, 0.12, 0.05, 0.8
    z_a, z_b = norm.isf(level), norm.ppf(power)
    a = z_a * math.sqrt(discordance / seeds)
    k = 1 + z_b**2 / seeds
    closed = (a + math.sqrt(a * a - k * (a * a - z_b**2 * discordance / seeds))) / k
    assert closed == pytest.approx(0.0606, abs=1e-4)
    assert detectable_regression(seeds, discordance, level, power) == pytest.approx(
        closed, rel=1e-6
    )
    # the rough (z_a + z_b) sqrt(r / n) ignores the d^2 in the variance: a little larger
    assert (z_a + z_b) * math.sqrt(discordance / seeds) == pytest.approx(0.0610, abs=1e-4)


def test_detectable_regression_shrinks_with_seeds() -> None:
    values = [detectable_regression(n, 0.12, 0.05) for n in (25, 50, 100, 200, 400, 800, 1600)]
    assert all(b < a for a, b in itertools.pairwise(values))
    # about 1 / sqrt(n): four times the seeds, about half the regression
    assert values[5] / values[3] == pytest.approx(0.5, abs=0.02)
    # a stricter level or more power needs a larger regression; more discordance too
    assert detectable_regression(200, 0.12, 0.01) > detectable_regression(200, 0.12, 0.05)
    assert detectable_regression(200, 0.12, 0.05, 0.9) > detectable_regression(200, 0.12, 0.05)
    assert detectable_regression(200, 0.2, 0.05) > detectable_regression(200, 0.12, 0.05)
    assert detectable_regression(0, 0.12, 0.05) == 1.0
    assert detectable_regression(2, 0.12, 0.05) == 1.0  # nothing below 100 points on 2 seeds


# -- group-sequential boundaries -------------------------------------------------------------------

FIVE_LOOKS = [0.2, 0.4, 0.6, 0.8, 1.0]


@pytest.mark.parametrize(
    ("spending", "critical"),
    [
        ("obrien-fleming", [4.8769, 3.3569, 2.6803, 2.2898, 2.0310]),
        ("pocock", [2.4380, 2.4268, 2.4101, 2.3966, 2.3859]),
    ],
)
def test_nominal_levels_match_gsdesign(spending: str, critical: list[float]) -> None:
    """gsDesign, one-sided total 0.025, 5 equally spaced looks, Lan-DeMets spending
    (sfLDOF, sfLDPocock)."""
    levels = nominal_levels(0.025, FIVE_LOOKS, spending)
    assert [float(norm.isf(level)) for level in levels] == pytest.approx(critical, abs=1e-3)


@pytest.mark.parametrize("spending", SPENDING)
def test_one_look_is_the_fixed_design(spending: str) -> None:
    assert nominal_levels(0.05, [1.0], spending) == pytest.approx([0.05], abs=1e-9)
    assert nominal_levels(0.2, [1.0], spending) == pytest.approx([0.2], abs=1e-9)
    assert spent(0.05, 1.0, spending) == pytest.approx(0.05)
    assert spent(0.05, 0.0, spending) == 0.0


def test_spending_functions() -> None:
    # Pocock-type: total * ln(1 + (e - 1) t); O'Brien-Fleming-type: 2 - 2 Phi(z_(1-a/2) / sqrt t)
    assert spent(0.05, 0.5, "pocock") == pytest.approx(0.05 * math.log(1 + (math.e - 1) / 2))
    assert spent(0.05, 0.5, "obrien-fleming") == pytest.approx(
        2 - 2 * norm.cdf(norm.ppf(0.975) / math.sqrt(0.5))
    )
    # O'Brien-Fleming keeps its error for the end, Pocock spends early
    assert spent(0.05, 0.2, "obrien-fleming") < 1e-3 < spent(0.05, 0.2, "pocock")
    with pytest.raises(ValueError, match="unknown spending function 'linear'"):
        spent(0.05, 0.5, "linear")
    with pytest.raises(ValueError, match="look fractions must increase"):
        nominal_levels(0.05, [0.5, 0.5, 1.0], "pocock")
    with pytest.raises(ValueError, match="the last look must be at the maximum"):
        nominal_levels(0.05, [0.5, 0.9], "pocock")


@pytest.mark.parametrize("spending", SPENDING)
def test_nominal_levels_spend_the_total_under_the_null(spending: str) -> None:
    """Monte Carlo: Brownian paths with no drift, observed at 10 equally spaced looks; the chance
    of crossing a look's boundary by look k is the error spent by then, and over all looks the
    total (within 4 Monte-Carlo standard errors)."""
    total, paths = 0.05, 20_000
    fractions = [(k + 1) / 10 for k in range(10)]
    levels = nominal_levels(total, fractions, spending)
    rng = np.random.default_rng(24)
    brownian = np.cumsum(rng.normal(0.0, math.sqrt(0.1), size=(paths, 10)), axis=1)
    z = brownian / np.sqrt(fractions)
    crossed = np.logical_or.accumulate(z >= norm.isf(levels), axis=1).mean(axis=0)
    for k, t in enumerate(fractions):
        expected = spent(total, t, spending)
        se = math.sqrt(expected * (1 - expected) / paths)
        assert crossed[k] == pytest.approx(expected, abs=4 * se), f"look {k + 1}"
    # each look's nominal level is below the total (the looks share it) ...
    assert max(levels) < total
    # ... and testing every look at the total would spend far more than the total
    naive = (z >= norm.isf(total)).any(axis=1).mean()
    assert naive > 2 * total
