"""Promotion decisions: error rates and seeds of the no-regression gate, paired and sequential,
on simulated paired outcomes of a candidate and a champion played on the same seeds.

Each seed's pair of outcomes is drawn with known success rates and a known correlation between
the two policies (the phi coefficient of the 2x2 table; by default the one implied by
:data:`DEFAULT_DISCORDANCE` at :data:`DEFAULT_CHAMPION_RATE`, or measured from two evaluation
reports with ``--reports``). Measured, by Monte Carlo (seeded numpy) where an exact value
is not at hand:

a. False blocks: how often a candidate exactly as good as the champion is blocked, by the
   fixed paired test (exact McNemar, one-sided 1 - ``evaluate.gate_confidence``) on 200 seeds
   and by the default sequential plan (``evaluate.sequential``): both must stay within the
   level (plus Monte-Carlo error).
b. Power on 200 seeds: how often a 5-point regression is caught by the paired test against
   the pooled two-proportion z-test (the old gate), both fixed at the same one-sided level
   (and, for reference, by the default sequential plan with a maximum of 200 seeds).
c. Seeds to a decision: the default sequential plan with a maximum of 1.2x the seeds the fixed
   paired test needs for 80% power at a 5-point regression; its false-block rate and power,
   the fixed design's seeds for the same power (exact McNemar power, computed exactly), and
   ``sequential_episode_ratio`` = the sequential plan's mean seeds (average of the equal and
   the 5-point-regression scenarios) / those fixed seeds. The alternative designs follow:
   20 looks, and O'Brien-Fleming spending.

The sequential runs are decided as :func:`~stages.evaluate.sequential.decide` decides on the
history of their looks (the block level spent on the discordant seeds seen so far), by a
:class:`Monitor` that carries :func:`~stages.evaluate.sequential.block_level`'s arithmetic
along each run instead of recomputing it at every look, checked against ``decide`` on the
first runs of every simulation.

Run: ``python benchmarks/promotion.py [--quick] [--reports CANDIDATE.json CHAMPION.json]``
(``--quick``: 2,000 repetitions, about 15 s; the full run, 20,000, about 40 s on 2 cores).
The correlation measured from two reports is the one to record in
:data:`DEFAULT_DISCORDANCE` (and :data:`DEFAULT_SOURCE`). One variant is simulated: its seeds
stand for all the variants' seeds of a suite. The last line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy.stats import binom

from stages.evaluate.config import EvalConfig, SequentialConfig
from stages.evaluate.sequential import (
    Decision,
    PairedTable,
    SequentialPlan,
    decide,
    is_worse,
    paired_table,
    plan_looks,
    rules_out,
)
from stages.register.config import PromotionConfig
from stages.statistics import mcnemar_p_value, spent, two_proportion_test

DEFAULT_CHAMPION_RATE = 0.8
"""The champion's success rate of the simulated scenarios (``--rate`` overrides it)."""
DEFAULT_DISCORDANCE = 0.229
"""Share of the seeds on which two equally good policies have different outcomes, at
:data:`DEFAULT_CHAMPION_RATE`: sets the correlation of the simulated outcomes."""
DEFAULT_SOURCE: str | None = (
    "two fine-tunes of the demo's VLA (LoRA: 80.0%, every parameter: 58.0%, held to a 3 cm "
    "success radius) on the same 200 held-out seeds: 104 both, 12 and 56 one only, 28 neither, "
    "phi 0.284"
)
"""Where :data:`DEFAULT_DISCORDANCE` was measured (two robo-pipe evaluation reports on the
same seeds); None while it is an assumed value. Update the three constants together."""

FIXED_SEEDS = 200
"""Seeds of the fixed designs in (a) and (b): the issue's example."""
INFLATION = 1.2
"""The sequential plan's maximum over the fixed design's seeds for 80% power."""


def phi_from_discordance(rate: float, discordance: float) -> float:
    """The phi coefficient of two policies with the same success ``rate`` whose outcomes differ
    on a share ``discordance`` of the seeds: ``1 - discordance / (2 rate (1 - rate))``."""
    return 1 - discordance / (2 * rate * (1 - rate))


def cells(candidate: float, baseline: float, phi: float) -> np.ndarray:
    """Probabilities of (both solve, candidate only, baseline only, neither) on a seed, for
    success rates ``candidate`` and ``baseline`` with correlation ``phi`` (clipped to the
    largest correlation the rates allow)."""
    spread = math.sqrt(candidate * (1 - candidate) * baseline * (1 - baseline))
    both = candidate * baseline + phi * spread
    both = min(min(candidate, baseline), max(max(0.0, candidate + baseline - 1), both))
    probs = np.array([both, candidate - both, baseline - both, 1 - candidate - baseline + both])
    return np.clip(probs, 0.0, 1.0) / np.clip(probs, 0.0, 1.0).sum()


def measure(candidate_report: Path, champion_report: Path) -> tuple[PairedTable, float]:
    """The paired table of two ``eval_report.json`` files on the same seeds, and its phi."""

    def outcomes(path: Path) -> dict[tuple[str, int], bool]:
        report = json.loads(path.read_text())
        return {(o["variant"], int(o["index"])): bool(o["success"]) for o in report["outcomes"]}

    table = paired_table(outcomes(candidate_report), outcomes(champion_report))
    if table.seeds == 0:
        raise SystemExit("the two reports share no (variant, seed index): not the same seeds")
    margins = (
        (table.both + table.candidate_only)
        * (table.baseline_only + table.neither)
        * (table.both + table.baseline_only)
        * (table.candidate_only + table.neither)
    )
    if margins == 0:
        raise SystemExit(f"a policy solved every seed or none: no correlation to measure ({table})")
    cross = table.both * table.neither - table.candidate_only * table.baseline_only
    return table, cross / math.sqrt(margins)


# -- fixed designs ---------------------------------------------------------------------------------


def critical_counts(max_discordant: int, level: float) -> np.ndarray:
    """Per discordant count D = 0..max: the largest number of seeds won by the candidate that
    exact McNemar still blocks at ``level`` (-1: none)."""
    crit = np.full(max_discordant + 1, -1)
    for d in range(1, max_discordant + 1):
        crit[d] = int(np.sum(binom.cdf(np.arange(d + 1), d, 0.5) <= level)) - 1
    return crit


def fixed_power(seeds: int, probs: np.ndarray, crit: np.ndarray) -> float:
    """Exact chance that the fixed exact McNemar test on ``seeds`` seeds blocks: the discordant
    count D ~ Binomial(seeds, r), the candidate's wins among them ~ Binomial(D, q)."""
    discordance = probs[1] + probs[2]
    if discordance <= 0:
        return 0.0
    share = probs[1] / discordance
    d = np.arange(seeds + 1)
    return float(np.sum(binom.pmf(d, seeds, discordance) * binom.cdf(crit[d], d, share)))


def seeds_for_power(power: float, probs: np.ndarray, crit: np.ndarray) -> int:
    """The fewest seeds at which the fixed exact McNemar test reaches ``power`` (a scan: the
    exact test's power is not monotone in the seeds)."""
    for seeds in range(1, len(crit)):
        if fixed_power(seeds, probs, crit) >= power:
            return seeds
    raise SystemExit(f"no fixed design up to {len(crit) - 1} seeds reaches power {power:.3f}")


def simulate_fixed(
    seeds: int, probs: np.ndarray, reps: int, level: float, rng: np.random.Generator
) -> tuple[float, float]:
    """Monte-Carlo blocking rates on ``seeds`` seeds, the same draws for both tests: (paired
    exact McNemar, pooled two-proportion z-test)."""
    tables = rng.multinomial(seeds, probs, size=reps)
    paired_cache: dict[tuple[int, int], float] = {}
    paired = pooled = 0
    for both, candidate_only, baseline_only, _ in tables.tolist():
        key = (candidate_only, baseline_only)
        if key not in paired_cache:
            paired_cache[key] = mcnemar_p_value(candidate_only, baseline_only)
        paired += paired_cache[key] <= level
        p_pooled = two_proportion_test(both + candidate_only, seeds, both + baseline_only, seeds)[2]
        pooled += p_pooled <= level
    return paired / reps, pooled / reps


# -- sequential plans ------------------------------------------------------------------------------


def default_plan(
    max_seeds: int, looks: int | None = None, spending: str | None = None
) -> SequentialPlan:
    """The plan the evaluation stage makes with the default configuration."""
    seq = SequentialConfig()
    return plan_looks(
        max_seeds,
        looks or seq.looks,
        1 - EvalConfig().gate_confidence,
        1 - seq.power,
        seq.regression,
        PromotionConfig().margin,
        spending or seq.spending,
    )


CHECKED_RUNS = 10
"""Runs of every simulation whose levels and decisions are checked against :func:`decide`."""


class Monitor:
    """:func:`decide` on many simulated runs of one plan, look by look.

    :func:`block_level` recomputes the null distribution of the baseline's wins from the first
    look at every call (the gate calls it once a look; a simulation would call it hundreds of
    thousands of times). Here the same arithmetic is carried along each run, one look at a
    time, and what repeats across runs is cached: the binomial rows, the cap at
    ``false_block``, the exact McNemar decisions and each look's pass region (the baseline
    wins up to which the paired interval rules out the regression, given the tied counts: its
    lower end falls as the baseline wins more of the discordant seeds, so a bisection on
    :func:`rules_out`). The levels and decisions are :func:`decide`'s (checked on the first
    :data:`CHECKED_RUNS` runs of every simulation). With a margin or a single look the level
    needs no history: :func:`decide` itself, cached on the history."""

    def __init__(self, plan: SequentialPlan) -> None:
        self.plan = plan
        self.exact = plan.margin <= 0 and len(plan.looks) > 1
        self.spent = [
            spent(plan.false_block, n / plan.looks[-1], plan.spending) for n in plan.looks
        ]
        self._binomial: dict[int, np.ndarray] = {}
        self._cap: dict[int, int] = {}
        self._level: dict[tuple[int, int], float] = {}
        self._worse: dict[tuple[int, int, float], bool] = {}
        self._passing: dict[tuple[int, int, int, int], int] = {}
        self._decided: dict[tuple[tuple[int, ...], ...], tuple[Decision, str, float]] = {}

    def run(self, counts: list[list[int]]) -> tuple[Decision, list[float]]:
        """The decision on one run's cumulative (both, candidate only, baseline only, neither)
        per look, and the block level of every look played (the last one decided)."""
        if not self.exact:
            return self._run_cached(counts)
        last = len(self.plan.looks) - 1
        alive, used, before = np.ones(1), 0.0, 0
        levels: list[float] = []
        for look, (both, candidate_only, baseline_only, neither) in enumerate(counts):
            d = candidate_only + baseline_only
            alive = np.convolve(alive, self.binomial(d - before))
            tail = np.append(np.cumsum(alive[::-1])[::-1], 0.0)
            critical = int(np.argmax(tail <= self.spent[look] - used + 1e-12))
            critical = max(critical, self.cap(d))
            level = self.level(d, critical)
            levels.append(level)
            if self.worse(candidate_only, baseline_only, level):
                return "worse", levels
            if look == last:
                return "not worse", levels
            passing = self.passing(look, both, neither, d)
            if baseline_only <= passing:
                return "not worse", levels
            used += float(tail[critical])
            alive = alive.copy()
            alive[critical:] = 0.0
            alive[: passing + 1] = 0.0
            before = d
        raise ValueError(f"a run of {len(counts)} looks ended undecided: the plan has {last + 1}")

    def binomial(self, n: int) -> np.ndarray:
        """Binomial(n, 1/2) probabilities of 0..n (new discordant seeds won by the baseline)."""
        if n not in self._binomial:
            self._binomial[n] = binom.pmf(np.arange(n + 1), n, 0.5)
        return self._binomial[n]

    def cap(self, d: int) -> int:
        """The smallest critical count whose exact tail on ``d`` discordant seeds is within
        ``false_block``."""
        if d not in self._cap:
            alone = binom.sf(np.arange(d + 1) - 1, d, 0.5)
            self._cap[d] = int(np.sum(alone > self.plan.false_block))
        return self._cap[d]

    def level(self, d: int, critical: int) -> float:
        """The exact McNemar level of blocking at ``critical`` baseline wins of ``d``."""
        if (d, critical) not in self._level:
            self._level[d, critical] = (
                float(binom.sf(critical - 1, d, 0.5)) if critical <= d else 0.0
            )
        return self._level[d, critical]

    def worse(self, candidate_only: int, baseline_only: int, level: float) -> bool:
        """:func:`is_worse` (the tied cells do not enter the exact test)."""
        key = (candidate_only, baseline_only, level)
        if key not in self._worse:
            table = PairedTable(0, candidate_only, baseline_only, 0)
            self._worse[key] = is_worse(table, level, self.plan.margin)
        return self._worse[key]

    def passing(self, look: int, both: int, neither: int, d: int) -> int:
        """The most baseline wins of the ``d`` discordant seeds with which the look's table
        still rules out the regression (-1: none)."""
        key = (look, both, neither, d)
        if key not in self._passing:
            plan = self.plan

            def passes(b: int) -> bool:
                table = PairedTable(both, d - b, b, neither)
                return rules_out(table, plan.pass_levels[look], plan.regression)

            low, high = -1, d + 1  # passes at b <= low, fails at b >= high
            while high - low > 1:
                middle = (low + high) // 2
                low, high = (middle, high) if passes(middle) else (low, middle)
            self._passing[key] = low
        return self._passing[key]

    def _run_cached(self, counts: list[list[int]]) -> tuple[Decision, list[float]]:
        history: list[PairedTable] = []
        levels: list[float] = []
        for look, cells_ in enumerate(counts):
            history.append(PairedTable(*cells_))
            key = tuple(tuple(c) for c in counts[: look + 1])
            if key not in self._decided:
                self._decided[key] = decide(self.plan, history)
            decision, _, level = self._decided[key]
            levels.append(level)
            if decision != "continue":
                return decision, levels
        raise ValueError(f"a run of {len(counts)} looks ended undecided")


def check(
    plan: SequentialPlan, counts: list[list[int]], decision: Decision, levels: list[float]
) -> None:
    """That :func:`decide` takes ``decision`` at the last look of ``levels`` on these tables,
    continues before, and holds the p-value against ``levels``."""
    history = [PairedTable(*c) for c in counts[: len(levels)]]
    for look, level in enumerate(levels):
        want = decision if look == len(levels) - 1 else "continue"
        got, _, block = decide(plan, history[: look + 1])
        if got != want or not math.isclose(block, level, rel_tol=1e-9, abs_tol=1e-15):
            raise SystemExit(
                f"the benchmark's Monitor disagrees with decide() at look {look + 1} of "
                f"{history[: look + 1]}: {want}, level {level} against {got}, level {block} "
                "(update Monitor to sequential.block_level)"
            )


def simulate_sequential(
    plan: SequentialPlan, probs: np.ndarray, reps: int, rng: np.random.Generator
) -> tuple[float, float]:
    """Monte Carlo: (share of runs decided "worse", mean seeds played to the decision)."""
    batches = np.diff([0, *plan.looks])
    tables = np.cumsum(
        np.stack([rng.multinomial(int(b), probs, size=reps) for b in batches], axis=1), axis=1
    )
    monitor = Monitor(plan)
    worse = 0
    seeds = 0
    for index, run in enumerate(tables.tolist()):
        decision, levels = monitor.run(run)
        if index < CHECKED_RUNS:
            check(plan, run, decision, levels)
        worse += decision == "worse"
        seeds += plan.looks[len(levels) - 1]
    return worse / reps, seeds / reps


def se(rate: float, reps: int) -> float:
    """Monte-Carlo standard error of a rate."""
    return math.sqrt(max(rate * (1 - rate), 1e-12) / reps)


def compare(
    label: str,
    plan: SequentialPlan,
    equal: np.ndarray,
    worse: np.ndarray,
    reps: int,
    rng: np.random.Generator,
    power_seeds: Callable[[float], int],
) -> dict[str, float]:
    """The sequential plan against the fixed design of the same power; prints a row."""
    false_block, seeds_equal = simulate_sequential(plan, equal, reps, rng)
    power, seeds_worse = simulate_sequential(plan, worse, reps, rng)
    fixed = power_seeds(power)
    mean = (seeds_equal + seeds_worse) / 2
    ratio = mean / fixed
    print(
        f"{label:<28} {plan.looks[-1]:>5} {false_block:>7.3f} {power:>7.3f} {seeds_equal:>8.1f} "
        f"{seeds_worse:>8.1f} {fixed:>7} {ratio:>7.3f}",
        flush=True,
    )
    return {
        "false_block": false_block,
        "power": power,
        "seeds_equal": seeds_equal,
        "seeds_regression": seeds_worse,
        "fixed": fixed,
        "ratio": ratio,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2,000 repetitions (CI speed)")
    parser.add_argument("--reps", type=int, default=20_000, help="Monte-Carlo repetitions")
    parser.add_argument(
        "--reports",
        nargs=2,
        type=Path,
        metavar=("CANDIDATE", "CHAMPION"),
        help="two eval_report.json files of two policies on the same seeds: measure the "
        "correlation (and the champion's rate) from them",
    )
    parser.add_argument("--rate", type=float, help="the champion's success rate")
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    reps = 2_000 if args.quick else args.reps
    level = 1 - EvalConfig().gate_confidence
    seq = SequentialConfig()
    regression = seq.regression
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()

    if args.reports:
        table, phi = measure(*args.reports)
        rate = (
            args.rate if args.rate is not None else (table.both + table.baseline_only) / table.seeds
        )
        source = (
            f"measured on {table.seeds} shared seeds of {args.reports[0].name} and "
            f"{args.reports[1].name}: {table}, discordance {table.discordant / table.seeds:.3f}"
        )
    else:
        rate = DEFAULT_CHAMPION_RATE if args.rate is None else args.rate
        phi = phi_from_discordance(DEFAULT_CHAMPION_RATE, DEFAULT_DISCORDANCE)
        source = (
            f"measured on {DEFAULT_SOURCE}"
            if DEFAULT_SOURCE
            else "ASSUMED default, not yet measured on robo-pipe's evaluations "
            "(measure it with --reports)"
        )
        source += (
            f": discordance {DEFAULT_DISCORDANCE} at a champion rate of {DEFAULT_CHAMPION_RATE}"
        )
    if not regression < rate < 1:
        raise SystemExit(f"the champion's rate must be in ({regression}, 1): {rate}")
    equal = cells(rate, rate, phi)
    worse = cells(rate - regression, rate, phi)
    discordance = float(equal[1] + equal[2])
    print(f"correlation phi = {phi:.3f} ({source})")
    print(
        f"champion {rate:.1%}; equal candidate: discordance {discordance:.3f}; "
        f"{regression:.0%} regression: cells (both, candidate only, champion only, neither) = "
        f"{np.round(worse, 4).tolist()}; one-sided level {level:g}; {reps:,} repetitions"
    )
    crit = critical_counts(5_000, level)

    # -- (a), (b): fixed designs on 200 seeds ------------------------------------------------------
    fixed_false_block, pooled_false_block = simulate_fixed(FIXED_SEEDS, equal, reps, level, rng)
    paired_power, pooled_power = simulate_fixed(FIXED_SEEDS, worse, reps, level, rng)
    plan_200 = default_plan(FIXED_SEEDS)
    seq_false_block_200, seq_seeds_200 = simulate_sequential(plan_200, equal, reps, rng)
    seq_power_200, seq_seeds_worse_200 = simulate_sequential(plan_200, worse, reps, rng)
    print(f"\n(a) false blocks, equal policies (level {level:g}; MC standard error in brackets)")
    print(
        f"  fixed paired, {FIXED_SEEDS} seeds:        {fixed_false_block:.4f} "
        f"[{se(fixed_false_block, reps):.4f}]  exact {fixed_power(FIXED_SEEDS, equal, crit):.4f}"
    )
    print(
        f"  fixed pooled, {FIXED_SEEDS} seeds:        {pooled_false_block:.4f} "
        f"[{se(pooled_false_block, reps):.4f}]"
    )
    print(
        f"  sequential ({seq.looks} looks, {seq.spending}), max {FIXED_SEEDS}: "
        f"{seq_false_block_200:.4f} [{se(seq_false_block_200, reps):.4f}]  "
        f"mean seeds {seq_seeds_200:.1f}"
    )
    print(f"\n(b) power at a {regression:.0%} regression, fixed, {FIXED_SEEDS} seeds")
    print(
        f"  paired (exact McNemar):       {paired_power:.4f} [{se(paired_power, reps):.4f}]  "
        f"exact {fixed_power(FIXED_SEEDS, worse, crit):.4f}"
    )
    print(f"  pooled (two-proportion z):    {pooled_power:.4f} [{se(pooled_power, reps):.4f}]")
    print(
        f"  sequential paired, max {FIXED_SEEDS}:   {seq_power_200:.4f} "
        f"[{se(seq_power_200, reps):.4f}]  mean seeds {seq_seeds_worse_200:.1f}"
    )

    # -- (c): sequential against fixed at the same power -------------------------------------------
    fixed_80 = seeds_for_power(seq.power, worse, crit)
    max_seeds = math.ceil(INFLATION * fixed_80)
    print(
        f"\n(c) seeds to a decision; the fixed paired test needs {fixed_80} seeds for "
        f"{seq.power:.0%} power; sequential maximum {max_seeds} ({INFLATION}x)"
    )
    print(
        f"{'plan':<28} {'max':>5} {'f.block':>7} {'power':>7} {'s.equal':>8} {'s.regr':>8} "
        f"{'fixed':>7} {'ratio':>7}"
    )

    def power_seeds(power: float) -> int:
        return seeds_for_power(power, worse, crit)

    main_row = compare(
        f"{seq.looks} looks, {seq.spending} (default)",
        default_plan(max_seeds),
        equal,
        worse,
        reps,
        rng,
        power_seeds,
    )
    extra = {}
    for key, looks, spending in (
        ("ratio_looks20", 20, seq.spending),
        ("ratio_obf", seq.looks, "obrien-fleming"),
        ("ratio_obf_looks20", 20, "obrien-fleming"),
    ):
        row = compare(
            f"{looks} looks, {spending}",
            default_plan(max_seeds, looks, spending),
            equal,
            worse,
            reps,
            rng,
            power_seeds,
        )
        extra[key] = row["ratio"]
    fixed_same = int(main_row["fixed"])
    print(
        f"  (fixed: the fewest seeds at which the fixed exact McNemar test has the sequential "
        f"plan's power; its exact false-block rate there is "
        f"{fixed_power(fixed_same, equal, crit):.4f})"
    )
    limit = level + 2 * se(level, reps)
    for name, rate_ in (
        ("fixed paired", fixed_false_block),
        ("sequential (max 200)", seq_false_block_200),
        ("sequential", main_row["false_block"]),
    ):
        verdict = "ok" if rate_ <= limit else "ABOVE the level"
        print(
            f"  false-block check, {name}: {rate_:.4f} vs {level:g} + 2 SE = {limit:.4f}: {verdict}"
        )
    print(f"done in {time.perf_counter() - start:.0f} s")
    extras = " ".join(f"{k}={v:.3f}" for k, v in extra.items())
    print(
        f"false_block={main_row['false_block']:.4f} paired_power={paired_power:.4f} "
        f"pooled_power={pooled_power:.4f} "
        f"sequential_episode_ratio={main_row['ratio']:.3f} "
        f"fixed_false_block={fixed_false_block:.4f} "
        f"sequential_false_block_200={seq_false_block_200:.4f} "
        f"sequential_power_200={seq_power_200:.4f} "
        f"fixed_seeds={fixed_same} fixed_seeds_80={fixed_80} max_seeds={max_seeds} "
        f"sequential_power={main_row['power']:.4f} "
        f"sequential_mean_seeds_equal={main_row['seeds_equal']:.1f} "
        f"sequential_mean_seeds_regression={main_row['seeds_regression']:.1f} "
        f"correlation={phi:.3f} discordance={discordance:.3f} champion_rate={rate:.3f} "
        f"reps={reps} assumed={int(not args.reports and DEFAULT_SOURCE is None)}"
        + (f" {extras}" if extras else "")
    )


if __name__ == "__main__":
    main()
