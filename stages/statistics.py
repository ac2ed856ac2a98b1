"""Statistics for success rates: binomial confidence intervals, paired tests, chance
baselines and group-sequential boundaries."""

from __future__ import annotations

import itertools
import math

import numpy as np


def wilson_interval(successes: int, trials: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (default 95%).

    Returns ``(low, high)`` in [0, 1]; ``(0.0, 1.0)`` when there are no trials. Unlike the
    normal approximation it stays inside [0, 1] and is honest at 0% and 100% success.
    """
    if trials <= 0:
        return 0.0, 1.0
    if not 0 <= successes <= trials:
        raise ValueError(f"successes must be in [0, {trials}], got {successes}")
    p = successes / trials
    denom = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denom
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denom
    # At 0% or 100% one bound equals p exactly in theory; float rounding can put it on the
    # wrong side of p (a negative error bar), so it is pinned.
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))


def normal_cdf(z: float) -> float:
    """Standard normal cumulative distribution function."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def two_proportion_test(
    successes_a: int, trials_a: int, successes_b: int, trials_b: int
) -> tuple[float, float, float]:
    """Pooled two-proportion z-test of A against B.

    Returns ``(difference p_a - p_b, z, one-sided p-value for "A is worse than B")``: a small
    p-value is evidence that A's success rate is below B's. Identical rates give z = 0 and
    p = 0.5; when both are 0% or 100% there is no evidence either way (z = 0, p = 0.5).
    """
    if trials_a <= 0 or trials_b <= 0:
        raise ValueError("both samples need at least one trial")
    p_a, p_b = successes_a / trials_a, successes_b / trials_b
    pooled = (successes_a + successes_b) / (trials_a + trials_b)
    se = math.sqrt(pooled * (1 - pooled) * (1 / trials_a + 1 / trials_b))
    if se == 0.0:
        return p_a - p_b, 0.0, 0.5
    z = (p_a - p_b) / se
    return p_a - p_b, z, normal_cdf(z)


def poisson_binomial_tail(probabilities: list[float], successes: int) -> float:
    """P(X >= ``successes``) for X the number of successes of independent trials with their
    own success ``probabilities`` (a Poisson-binomial variable), exactly.

    The one-sided p-value of "more successes than a policy that succeeds on trial i with
    probability p_i" (a chance baseline that varies from seed to seed). Dynamic programming
    over the trials, O(n^2) for n trials: the distribution of the count after each trial.
    """
    if any(not 0.0 <= p <= 1.0 for p in probabilities):
        raise ValueError("probabilities must lie in [0, 1]")
    if successes <= 0:
        return 1.0
    if successes > len(probabilities):
        return 0.0
    counts = np.zeros(len(probabilities) + 1)  # counts[k] = P(k successes so far)
    counts[0] = 1.0
    for i, p in enumerate(probabilities):
        counts[1 : i + 2] = counts[1 : i + 2] * (1.0 - p) + counts[: i + 1] * p
        counts[0] *= 1.0 - p
    # Summing the tail itself (not 1 - the rest) keeps a tiny p-value's relative precision.
    return float(min(1.0, counts[successes:].sum()))


# -- paired comparisons on shared seeds ------------------------------------------------------------


def mcnemar_p_value(candidate_only: int, baseline_only: int) -> float:
    """One-sided exact McNemar p-value for "the candidate is worse than the baseline".

    Only the discordant seeds carry evidence (seeds both solved or both failed say nothing about
    which policy is better): under "not worse" the candidate wins at most half of them, so the
    p-value is P(X <= candidate_only) for X ~ Binomial(discordant, 1/2) (scipy's exact
    ``binomtest``). No discordant seed gives p = 1 (no evidence of a regression)."""
    from scipy.stats import binomtest

    discordant = candidate_only + baseline_only
    if min(candidate_only, baseline_only) < 0:
        raise ValueError("discordant counts must be >= 0")
    if discordant == 0:
        return 1.0
    return float(binomtest(candidate_only, discordant, 0.5, alternative="less").pvalue)


def paired_difference_interval(
    both: int, candidate_only: int, baseline_only: int, neither: int, confidence: float = 0.95
) -> tuple[float, float]:
    """Newcombe's hybrid score interval (Newcombe 1998, Statistics in Medicine 17:2635, method
    10) for the candidate's success rate minus the baseline's on the same seeds, two-sided at
    ``confidence``: the two Wilson intervals combined with the correlation of the paired
    outcomes (phi, corrected as Newcombe does). Returns ``(low, high)`` in [-1, 1]."""
    n = both + candidate_only + baseline_only + neither
    if n <= 0:
        return -1.0, 1.0
    z = _z(1 - (1 - confidence) / 2)
    p1, p2 = (both + candidate_only) / n, (both + baseline_only) / n
    l1, u1 = wilson_interval(both + candidate_only, n, z)
    l2, u2 = wilson_interval(both + baseline_only, n, z)
    margins = ((both + candidate_only) * (baseline_only + neither) * (both + baseline_only)) * (
        candidate_only + neither
    )
    phi = 0.0
    if margins > 0:
        cross = both * neither - candidate_only * baseline_only
        if cross > n / 2:
            phi = (cross - n / 2) / math.sqrt(margins)
        elif cross < 0:
            phi = cross / math.sqrt(margins)
    diff = p1 - p2
    below, above = p1 - l1, u2 - p2  # how far the difference can fall: p1 down, p2 up
    low = diff - math.sqrt(max(0.0, below**2 - 2 * phi * below * above + above**2))
    below, above = p2 - l2, u1 - p1  # and rise: p2 down, p1 up
    high = diff + math.sqrt(max(0.0, above**2 - 2 * phi * above * below + below**2))
    return max(-1.0, low), min(1.0, high)


def detectable_regression(
    seeds: int, discordance: float, level: float, power: float = 0.8
) -> float:
    """The smallest regression (success-rate points, 0..1) a one-sided paired test at ``level``
    on ``seeds`` shared seeds catches with probability ``power``, when a share ``discordance``
    of the seeds has different outcomes (McNemar's normal approximation: a regression ``d``
    with discordance ``r`` moves the discordant difference by ``seeds * d`` with variance
    ``seeds * (r - d**2)``; the discordance is at least ``d``). 1.0 when nothing smaller can be
    caught."""
    from scipy.optimize import brentq

    if seeds <= 0:
        return 1.0
    z_level, z_power = _z(1 - level), _z(power)

    def shortfall(d: float) -> float:
        r = max(discordance, d)
        return seeds * d - z_level * math.sqrt(seeds * r) - z_power * math.sqrt(seeds * (r - d * d))

    if shortfall(1.0) < 0:
        return 1.0
    return float(brentq(shortfall, 1e-9, 1.0))


def _z(quantile: float) -> float:
    from scipy.stats import norm

    return float(norm.ppf(quantile))


# -- group-sequential boundaries -------------------------------------------------------------------

SPENDING = ("obrien-fleming", "pocock")
"""Lan-DeMets error-spending functions: O'Brien-Fleming-type spends almost nothing at early
looks (stops early only on overwhelming evidence, keeps the last look close to the fixed
design's); Pocock-type spends evenly (stops earlier on average, costs more at the last look)."""


def spent(total: float, fraction: float, spending: str) -> float:
    """Error (false-block or miss) spent by information ``fraction`` (0..1] of the maximum
    (Lan & DeMets 1983): O'Brien-Fleming-type ``2 - 2 Phi(z_(1-total/2) / sqrt(t))`` or
    Pocock-type ``total * ln(1 + (e - 1) t)``; both reach ``total`` at t = 1."""
    from scipy.stats import norm

    t = min(1.0, max(0.0, fraction))
    if t == 0.0:
        return 0.0
    if spending == "obrien-fleming":
        return float(2 - 2 * norm.cdf(norm.ppf(1 - total / 2) / math.sqrt(t)))
    if spending == "pocock":
        return total * math.log(1 + (math.e - 1) * t)
    choices = ", ".join(SPENDING)
    raise ValueError(f"unknown spending function {spending!r}; valid choices: {choices}")


def nominal_levels(total: float, fractions: list[float], spending: str) -> list[float]:
    """Per-look nominal one-sided levels of a group-sequential test: at look k a nominal
    p-value at or below ``levels[k]`` crosses the boundary, and the chance of crossing at any
    look when the null holds is ``total``, spent over the looks as ``spending`` says.

    ``fractions``: the information at each look over the maximum, increasing, the last 1.0.
    The levels come from the joint normal distribution of the looks' statistics (a Brownian
    motion observed at the fractions; Armitage, McPherson & Rowe's recursive numerical
    integration on a grid), so they hold for any statistic that is asymptotically normal
    with independent increments, McNemar's among them."""
    from scipy.optimize import brentq
    from scipy.signal import fftconvolve
    from scipy.stats import norm

    if not fractions or any(b <= a for a, b in itertools.pairwise([0.0, *fractions])):
        raise ValueError(f"look fractions must increase from above 0: {fractions}")
    if abs(fractions[-1] - 1.0) > 1e-9:
        raise ValueError(f"the last look must be at the maximum (fraction 1.0): {fractions}")
    if len(fractions) == 1:  # the fixed design: one test at the whole level
        return [total]
    grid = np.linspace(-12.0, 12.0, 19201)  # the Brownian motion's value S_k = Z_k sqrt(t_k)
    step = grid[1] - grid[0]
    density: np.ndarray | None = None  # of S at the previous look, on its continuation region
    previous_t = previous_spent = 0.0
    levels = []
    for t in fractions:
        target = spent(total, t, spending) - previous_spent
        sd = math.sqrt(t - previous_t)
        weights = None if density is None else density * step

        def excess(
            bound: float,
            sd: float = sd,
            weights: np.ndarray | None = weights,
            target: float = target,
        ) -> float:
            """Chance of crossing ``bound`` first at this look, less the error to spend here."""
            if weights is None:  # the first look: S is normal around 0
                return float(norm.sf(bound / sd)) - target
            return float(np.sum(weights * norm.sf((bound - grid) / sd))) - target

        bound = brentq(excess, -12.0, 40.0, xtol=1e-10) if target > 0 else 40.0
        levels.append(float(norm.sf(bound / math.sqrt(t))))
        # The density of S at this look, where the test continued (below the boundary).
        if density is None:
            new = norm.pdf(grid / sd) / sd
        else:
            kernel = norm.pdf(np.arange(-len(grid) + 1, len(grid)) * step / sd) / sd
            new = fftconvolve(density * step, kernel, mode="same")
        density = np.where(grid < bound, new, 0.0)
        previous_t, previous_spent = t, previous_spent + target
    return levels
