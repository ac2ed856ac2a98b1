"""Statistics for success rates: binomial confidence intervals."""

from __future__ import annotations

import math


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
