"""The evaluate stage: run the suite, compare with a baseline, write the report.

suite    = scene variants x seeds, sharded over Ray workers   (:mod:`stages.evaluate.shards`)
report   = success with 95% Wilson intervals, per-variant rows (:mod:`stages.evaluate.report`)
baseline = the same suite and seeds; the gate fails only if the policy is worse
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from robo_pipe.locks import StatusFn
from sim_scenes.config import SceneConfig, SimConfig
from stages.evaluate.config import EvalConfig
from stages.evaluate.report import EvalReport, compare, summarize, write_report
from stages.evaluate.shards import ShardOutcome, check_policy_fits, run_suite


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
) -> EvalReport:
    """Evaluate ``policy`` (checkpoint directory or exported ONNX) on the suite; with a
    ``baseline``, evaluate it on the same seeds and gate on the difference. Writes
    ``report.md``, ``success.png``, frame strips and ``eval_report.json`` into ``out``.
    ``on_status`` gets a line for each worker that died and was restarted.

    Raises:
        WorkersDiedError: a worker died more than ``config.max_worker_restarts`` times.
    """
    if baseline is not None:
        check_policy_fits(baseline, robot)  # both refused before any work
    shards, facts = run_suite(
        policy, robot, scene, sim, config, seed, ray_address, on_shard, on_status
    )
    report = summarize(str(policy), shards, facts, seed)
    if baseline is not None:
        base_shards, base_facts = run_suite(
            baseline, robot, scene, sim, config, seed, ray_address, on_shard, on_status
        )
        report.comparison = compare(
            report, summarize(str(baseline), base_shards, base_facts, seed), config.gate_confidence
        )
    write_report(report, shards, out, config.record_episodes)
    return report
