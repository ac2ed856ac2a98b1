"""The evaluate stage: run the suite, compare with a baseline, write the report.

suite    = scene variants x seeds, sharded over Ray workers   (:mod:`stages.evaluate.shards`)
report   = success with 95% Wilson intervals, per-variant rows (:mod:`stages.evaluate.report`);
           touch's language section: success where a word is needed against ignoring it
           (:mod:`stages.evaluate.language`)
baseline = the same seeds, paired: both policies play batches of seeds until the plan's
           boundaries decide "worse" or "not worse" (:mod:`stages.evaluate.sequential`);
           the baseline's stored outcomes are reused instead of playing those seeds again;
           after "not worse" the candidate plays on alone while its success is undecided
           against the success gate's bar (``min_success``)
delay    = with ``evaluate.delay``, the policy plays as a robot whose inference takes time
           (:mod:`stages.evaluate.delay`), and its baseline is itself at zero delay (the cost
           of the latency, paired on the same seeds), or another policy given as the baseline
           at the same delay (which of the two holds it better)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from robo_pipe.locks import StatusFn
from robots.spec import get_robot
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.seeds import episode_seeds
from stages.evaluate.comparison import compare_outcomes
from stages.evaluate.config import EvalConfig
from stages.evaluate.delay import delay_plan
from stages.evaluate.language import suite_language
from stages.evaluate.report import EvalReport, summarize, write_report
from stages.evaluate.sequential import (
    Decision,
    PairedTable,
    SequentialPlan,
    decide,
    encode_outcomes,
    paired_table,
    plan_looks,
    success_undecided,
)
from stages.evaluate.shards import ShardOutcome, Suite, plan_shards

Outcomes = Mapping[tuple[str, int], bool]
"""(variant, seed index) -> solved."""


def comparison_plan(config: EvalConfig, margin: float = 0.0) -> SequentialPlan:
    """The looks and boundaries of a comparison with a baseline, from ``evaluate``'s settings
    (one look when ``sequential.enabled`` is False) and the promotion ``margin``."""
    seq = config.sequential
    return plan_looks(
        config.episodes,
        seq.looks if seq.enabled is not False else 1,
        1 - config.gate_confidence,
        1 - seq.power,
        seq.regression,
        margin,
        seq.spending,
    )


def evaluate(
    policy: str | Path,
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: EvalConfig,
    seed: int,
    out: Path,
    baseline: str | Path | None = None,
    ray_address: str | None = None,
    on_shard: Callable[[ShardOutcome], None] | None = None,
    on_status: StatusFn | None = None,
    baseline_outcomes: Outcomes | None = None,
    margin: float = 0.0,
    min_success: float | None = None,
) -> EvalReport:
    """Evaluate ``policy`` (checkpoint directory or exported ONNX) on the suite; with a
    ``baseline``, compare the two on the same seeds (sequentially unless
    ``config.sequential.enabled`` is False), reusing ``baseline_outcomes`` (the baseline's
    stored results on this suite) instead of playing those seeds again. When the comparison
    stops early with "not worse", the candidate plays on alone while ``min_success`` (the
    success gate's bar) lies inside its 95% interval, so that gate never decides on fewer
    episodes than it needs. Writes ``report.md``, ``success.png``, frame strips and
    ``eval_report.json`` into ``out``. ``on_status`` gets a line for each worker that died and
    was restarted.

    With an inference delay (``config.delay``), ``policy`` plays it and the baseline is
    ``policy`` at zero delay (``baseline_outcomes``: its stored zero-delay outcomes), or the
    ``baseline`` given, playing the same delay; the report's ``delay`` says what was played.

    Raises:
        SceneError / PolicySpecError: a suite or policy that does not fit, before any work.
        DelayError: a delay the policy (or the baseline) cannot play, before any work.
        WorkersDiedError: a worker died more than ``config.max_worker_restarts`` times.
    """
    seeds = episode_seeds(seed, config.episodes, "eval")
    delay = delay_plan(config.delay, get_robot(robot))
    baseline_name, delays = str(baseline), [delay]
    if delay is not None and baseline is None:  # the cost of the delay: itself at zero delay
        baseline, baseline_name = policy, f"{policy} at zero delay"
    elif delay is not None:  # another policy, playing the same delay
        baseline_name, delays = f"{baseline} at the same delay", [delay, delay]
    plan = comparison_plan(config, margin) if baseline is not None else None  # checked first
    policies = [policy] if baseline is None else [policy, baseline]
    with Suite(
        policies, robot, scene, sim, config, ray_address, on_shard, on_status, delays
    ) as suite:
        if baseline is None or plan is None:
            shards = suite.play(plan_shards(suite.variants, seeds, config.episodes_per_shard))
            report = summarize(str(policy), shards, suite.facts(seeds), seed)
        else:
            stored = dict(baseline_outcomes or {})
            c = _compare(suite, plan, seeds, config.episodes_per_shard, stored, min_success)
            report = summarize(str(policy), c.shards, suite.facts(seeds[: c.played]), seed)
            candidate = report.successes_by_episode()
            played_on = c.played - plan.looks[c.look]
            report.comparison = compare_outcomes(
                candidate, c.baseline, plan, c.look, c.verdict, baseline_name, c.reused, played_on
            )
            report.baseline_outcomes = encode_outcomes(c.baseline)
            shards = c.shards
        report.delay = suite.delays[0]
    report.language = suite_language(report.outcomes, get_robot(robot), report.phrasing)
    write_report(report, shards, out, config.record_episodes)
    return report


@dataclass
class _Compared:
    """What :func:`_compare` played and decided."""

    shards: list[ShardOutcome]
    """The candidate's."""
    baseline: dict[tuple[str, int], bool]
    """The baseline's outcomes on the seeds compared (played or stored)."""
    reused: int
    """Of those, how many were stored."""
    look: int
    """The look (0-based) that decided."""
    verdict: tuple[Decision, str, float]
    """:func:`~stages.evaluate.sequential.decide`'s answer there."""
    played: int
    """Seeds per variant the candidate played: the deciding look's, or more while its success
    was undecided against the bar."""


def _compare(
    suite: Suite,
    plan: SequentialPlan,
    seeds: list[int],
    per_shard: int,
    stored: dict,
    min_success: float | None,
) -> _Compared:
    """Play batches of seeds, candidate and baseline (the baseline only where ``stored`` has
    no outcome), until the plan decides; after "not worse", the candidate alone plays on
    while ``min_success`` is undecided (:func:`success_undecided`)."""
    shards: list[ShardOutcome] = []
    history: list[PairedTable] = []
    baseline: dict[tuple[str, int], bool] = {}
    reused, done = 0, 0
    for upto in plan.looks:
        batch, done = range(done, upto), upto
        work = plan_shards(suite.variants, seeds, per_shard, batch, policy=0)
        for variant in suite.variants:
            for run in _runs([i for i in batch if (variant, i) not in stored]):
                work += plan_shards([variant], seeds, per_shard, run, policy=1)
        for result in suite.play(work):
            if result.shard.policy == 0:
                shards.append(result)
            else:
                baseline.update({(e.variant, e.index): e.success for e in result.episodes})
        for variant in suite.variants:
            for i in batch:
                if (variant, i) in stored:
                    baseline[variant, i] = stored[variant, i]
                    reused += 1
        candidate = {(e.variant, e.index): e.success for s in shards for e in s.episodes}
        history.append(paired_table(candidate, baseline))
        verdict = decide(plan, history)
        if verdict[0] != "continue":
            break
    look = len(history) - 1
    # The success gate may need more of the candidate's episodes than the comparison did.
    for upto in plan.looks[look + 1 :] if verdict[0] == "not worse" else []:
        episodes = [e.success for s in shards for e in s.episodes]
        if not success_undecided(sum(episodes), len(episodes), min_success):
            break
        shards += suite.play(plan_shards(suite.variants, seeds, per_shard, range(done, upto)))
        done = upto
    return _Compared(shards, baseline, reused, look, verdict, done)


def _runs(indices: list[int]) -> list[range]:
    """Consecutive runs of sorted ``indices`` as ranges: [3, 4, 5, 9] -> [3:6, 9:10]."""
    runs: list[range] = []
    for i in indices:
        if runs and runs[-1].stop == i:
            runs[-1] = range(runs[-1].start, i + 1)
        else:
            runs.append(range(i, i + 1))
    return runs
