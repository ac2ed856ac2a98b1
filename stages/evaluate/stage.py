"""``evaluate()``: the stage entry point -- run the suite, compare with a baseline, write the
report (see :mod:`stages.evaluate.run` for how episodes are sharded and merged)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sim_scenes.config import SceneConfig, SimConfig
from stages.evaluate.config import EvalConfig
from stages.evaluate.report import EvalReport, compare, summarize, write_report
from stages.evaluate.run import ShardOutcome, check_policy_fits, run_suite


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
) -> EvalReport:
    """Evaluate ``policy`` (checkpoint directory or exported ONNX) on the suite; with a
    ``baseline``, evaluate it on the same seeds and gate on the difference. Writes
    ``report.md``, ``success.png``, frame strips and ``eval_report.json`` into ``out``.
    """
    if baseline is not None:
        check_policy_fits(baseline, robot)  # both refused before any work
    shards, facts = run_suite(policy, robot, scene, sim, config, seed, ray_address, on_shard)
    report = summarize(str(policy), shards, facts, seed)
    if baseline is not None:
        base_shards, base_facts = run_suite(
            baseline, robot, scene, sim, config, seed, ray_address, on_shard
        )
        report.comparison = compare(
            report, summarize(str(baseline), base_shards, base_facts, seed), config.gate_confidence
        )
    write_report(report, shards, out, config.record_episodes)
    return report
