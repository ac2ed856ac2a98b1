"""What does a worker killed halfway cost a collect and an evaluation?

Runs a 2-worker collect and a 2-worker evaluation twice each on the same seeds: undisturbed,
then with one worker killed (``SIGKILL``, as the out-of-memory killer does) halfway: once half
the shards are done, half a shard's time into the next shard of the worker that just finished
one. Ray restarts the worker and runs its shard again. Prints the wall time of each run, the
extra time, one shard's time for comparison (the goal: the extra is at most one shard's time),
and whether the killed run gave the same result (dataset content hash; per-episode outcomes).
Ray itself is started before timing; actor start-up is included in every run.

Run: ``python benchmarks/worker_faults.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.config import CONFIG_DIR, PipelineConfig, load_config
from stages.collect import ShardResult, collect
from stages.evaluate.shards import ShardOutcome, run_suite
from stages.policy.checkpoint import save_new_policy
from stages.ray_runtime import init_ray


class ShardClock:
    """An ``on_shard`` that times shards: the wall time between one worker's results."""

    def __init__(self) -> None:
        self.last: dict[int, float] = {}
        self.intervals: list[float] = []
        self.shards = 0

    def __call__(self, result: ShardResult | ShardOutcome) -> None:
        now = time.perf_counter()
        if result.pid in self.last:
            self.intervals.append(now - self.last[result.pid])
        self.last[result.pid] = now
        self.shards += 1

    @property
    def shard_s(self) -> float:
        """One worker's mean wall seconds per shard (its first one, after start-up, excluded)."""
        return sum(self.intervals) / len(self.intervals)


class HalfwayKiller:
    """An ``on_shard`` that kills one worker halfway: once half the shards are done, half a
    shard's time into the next shard of the worker that returned the last of them (the pool
    hands it that one before the caller sees this result)."""

    def __init__(self, shards: int, shard_s: float) -> None:
        self.halfway, self.shard_s = shards // 2, shard_s
        self.done = 0
        self.killed: int | None = None

    def __call__(self, result: ShardResult | ShardOutcome) -> None:
        self.done += 1
        if self.done == self.halfway:
            self.killed = result.pid
            threading.Timer(self.shard_s / 2, os.kill, (result.pid, signal.SIGKILL)).start()


def timed(run: Callable[[], Any]) -> tuple[float, Any]:
    """``run()``'s wall seconds and result."""
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def undisturbed_then_killed(
    clean_run: Callable[[Any], Any], killed_run: Callable[[Any], Any]
) -> dict[str, Any]:
    """Time ``clean_run(on_shard)`` (measuring the shards), then ``killed_run(on_shard)`` with
    one worker killed halfway; both results must match."""
    clock = ShardClock()
    clean_s, clean = timed(lambda: clean_run(clock))
    killer = HalfwayKiller(clock.shards, clock.shard_s)
    killed_s, killed = timed(lambda: killed_run(killer))
    assert killer.killed is not None
    return {
        "undisturbed_s": clean_s,
        "killed_s": killed_s,
        "shard_s": clock.shard_s,
        "same": killed == clean,
    }


def bench_collect(cfg: PipelineConfig, episodes: int, tmp: Path) -> dict[str, Any]:
    """A 2-worker collect of ``episodes`` in the config's shards, undisturbed and with a worker
    killed."""
    config = cfg.collect.model_copy(update={"workers": 2, "episodes": episodes})

    def collect_into(out: Path, on_shard: Callable[[ShardResult], None]) -> str:
        ref = collect(
            cfg.robot, cfg.scene, cfg.sim, config, cfg.seed, out, None, on_shard, on_status=print
        )
        return ref.content_hash

    return undisturbed_then_killed(
        lambda on_shard: collect_into(tmp / "clean", on_shard),
        lambda on_shard: collect_into(tmp / "killed", on_shard),
    )


def bench_evaluate(cfg: PipelineConfig, episodes: int, tmp: Path) -> dict[str, Any]:
    """A 2-worker evaluation of ``episodes`` per variant in the config's shards, undisturbed and
    with a worker killed."""
    policy = save_new_policy(cfg.policy, cfg.scene.cameras, cfg.scene.image_size, tmp / "vla")
    config = cfg.evaluate.model_copy(update={"workers": 2, "episodes": episodes})

    def evaluate(on_shard: Callable[[ShardOutcome], None]) -> list[Any]:
        shards, _ = run_suite(
            policy, cfg.robot, cfg.scene, cfg.sim, config, cfg.seed, None, on_shard, print
        )
        return [episode for shard in shards for episode in shard.episodes]

    return undisturbed_then_killed(evaluate, evaluate)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="800 episodes collected, 100 per variant evaluated"
    )
    args = parser.parse_args()
    collect_episodes, eval_episodes = (800, 100) if args.quick else (2000, 200)
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    init_ray(None)
    with tempfile.TemporaryDirectory() as tmp:
        rows = {
            "collect": bench_collect(cfg, collect_episodes, Path(tmp)),
            "evaluate": bench_evaluate(cfg, eval_episodes, Path(tmp)),
        }
    print(
        f"\n2 workers; collect {collect_episodes} episodes in shards of "
        f"{cfg.collect.episodes_per_shard}, evaluate {eval_episodes} per variant in shards of "
        f"{cfg.evaluate.episodes_per_shard}; one worker killed halfway"
    )
    print(f"{'stage':<9} {'undisturbed s':>13} {'killed s':>9} {'extra s':>8} {'shard s':>8}  same")
    figures = []
    for stage, r in rows.items():
        extra = r["killed_s"] - r["undisturbed_s"]
        print(
            f"{stage:<9} {r['undisturbed_s']:>13.1f} {r['killed_s']:>9.1f} {extra:>8.1f} "
            f"{r['shard_s']:>8.1f}  {'yes' if r['same'] else 'NO'}"
        )
        figures += [
            f"{stage}_undisturbed_s={r['undisturbed_s']:.1f}",
            f"{stage}_killed_s={r['killed_s']:.1f}",
            f"{stage}_extra_s={extra:.1f}",
            f"{stage}_shard_s={r['shard_s']:.1f}",
            f"{stage}_extra_in_shards={extra / r['shard_s']:.2f}",
            f"{stage}_same_result={str(r['same']).lower()}",
        ]
    print(" ".join(figures))


if __name__ == "__main__":
    main()
