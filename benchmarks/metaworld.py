"""Meta-World through robo-pipe's backend: each MT10 task's scripted expert, success over seeded
episodes, and env steps/s with camera images.

Plays ``--seeds`` episodes (benchmark seed stream) of every MT10 task (``metaworld/<task>``)
with its scripted expert (``metaworld.policies``), through
:class:`~sim_scenes.metaworld.batched.MetaWorldBatchedEnv`: ``--envs`` environments in
``--workers`` worker processes, each step asking the workers for the experts' actions, stepping
and bringing back the states and a ``--size`` px frame of ``--camera``. An episode ends at the
task's success or its cap (200 steps). steps/s counts env steps over the wall time of the
episodes, resets included; load is the machine's 1-minute load average at the end: the
figures are shared with whatever else ran.

Run: ``python benchmarks/metaworld.py [--quick] [--seeds N]`` (needs ``make metaworld-env``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from robo_pipe.errors import RoboPipeError
from robots.sawyer import SAWYER
from sim_scenes.episodes import play_episodes
from sim_scenes.metaworld.batched import MetaWorldBatchedEnv
from sim_scenes.metaworld.env import metaworld_python
from sim_scenes.metaworld.tasks import METAWORLD, MT10_TASKS
from sim_scenes.seeds import episode_seeds
from stages.statistics import wilson_interval


def experts(args: argparse.Namespace, seeds: list[int]) -> dict[str, float]:
    """Per task: the expert's success rate and mean steps; overall: steps/s with images."""
    results: dict[str, float] = {}
    steps_total, seconds, successes = 0, 0.0, 0
    print(f"{'task':<22} {'success':>8} {'95% CI':>15} {'steps':>6} {'steps/s':>8}")
    for task in MT10_TASKS:
        name = task.removesuffix("-v3")
        tick = time.perf_counter()
        with MetaWorldBatchedEnv(
            SAWYER,
            METAWORLD.variant(name),
            args.envs,
            (args.camera,),
            args.size,
            workers=args.workers,
            autoreset=False,
        ) as env:
            records = play_episodes(env, METAWORLD.expert(SAWYER), seeds)
        task_seconds = time.perf_counter() - tick
        solved = sum(r.success for r in records)
        steps = sum(r.length for r in records)
        low, high = wilson_interval(solved, len(seeds))
        print(
            f"{name:<22} {solved / len(seeds):>8.0%} {f'[{low:.0%}, {high:.0%}]':>15} "
            f"{steps / len(seeds):>6.0f} {steps / task_seconds:>8.0f}"
        )
        results[f"{name}_expert"] = solved / len(seeds)
        results[f"{name}_steps"] = steps / len(seeds)
        steps_total, seconds, successes = (
            steps_total + steps,
            seconds + task_seconds,
            successes + solved,
        )
    results["mt10_expert"] = successes / (len(seeds) * len(MT10_TASKS))
    results["steps_per_s"] = steps_total / seconds
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds per task")
    parser.add_argument("--seeds", type=int, default=10, help="episodes per task")
    parser.add_argument("--camera", default="corner2", help="Meta-World camera to render")
    parser.add_argument("--size", type=int, default=64, help="image side, px")
    parser.add_argument("--envs", type=int, default=4, help="environments stepped together")
    parser.add_argument("--workers", type=int, default=2, help="Meta-World worker processes")
    parser.add_argument(
        "--experts-only", action="store_true", help="the scripted experts alone (no policy)"
    )
    args = parser.parse_args()
    seeds = episode_seeds(0, 2 if args.quick else args.seeds, "benchmark")
    try:
        metaworld_python()  # a missing environment is named before any work
        results = experts(args, seeds)
    except RoboPipeError as err:  # a missing environment, an unknown camera: exit 2
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(
        f"seeds={len(seeds)} camera={args.camera} size={args.size} envs={args.envs} "
        f"workers={args.workers} "
        + " ".join(f"{k}={v:.3g}" for k, v in results.items())
        + f" load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
