"""Wilson intervals and the two-proportion test against published and hand-worked values."""

from __future__ import annotations

import pytest

from stages.statistics import two_proportion_test, wilson_interval


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
