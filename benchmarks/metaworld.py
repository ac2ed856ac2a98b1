"""Meta-World through robo-pipe's worker: each MT10 task's scripted expert, success over seeded
episodes, and env steps/s with camera images.

Plays ``--seeds`` episodes (benchmark seed stream) of every MT10 task with its scripted expert
(``metaworld.policies``), through :class:`~sim_scenes.metaworld.client.MetaWorldEnv`: each step
asks the worker for the expert's action, steps and brings back the state and a ``--size`` px
frame of ``--camera``. An episode ends at the task's success or its 500-step cap. steps/s counts
those round trips (expert, physics, rendering, transfer), not the resets (reset_s: a task's first
reset builds its env, ~1-2 s; later ones ~50 ms, Meta-World settling the arm). load is the
machine's 1-minute load average at the end: the figures are shared with whatever else ran.

Run: ``python benchmarks/metaworld.py [--quick] [--seeds N]`` (needs ``make metaworld-env``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from robo_pipe.errors import RoboPipeError
from sim_scenes.metaworld.client import MT10_TASKS, MetaWorldEnv
from sim_scenes.seeds import episode_seeds
from stages.statistics import wilson_interval


def measure(env: MetaWorldEnv, seeds: list[int]) -> dict[str, float]:
    """Per task: success rate and mean steps; overall: steps/s and seconds per reset."""
    results: dict[str, float] = {}
    steps_total, step_seconds, reset_seconds, successes = 0, 0.0, 0.0, 0
    print(f"{'task':<24} {'success':>8} {'95% CI':>15} {'steps':>6} {'steps/s':>8}")
    for task in MT10_TASKS:
        solved, lengths, task_seconds = 0, [], 0.0
        for seed in seeds:
            tick = time.perf_counter()
            env.reset(task, seed)
            reset_seconds += time.perf_counter() - tick
            tick = time.perf_counter()
            for length in range(1, env.max_steps + 1):  # noqa: B007 - read after the loop
                if env.step(env.expert_action()).success:
                    solved += 1
                    break
            task_seconds += time.perf_counter() - tick
            lengths.append(length)
        low, high = wilson_interval(solved, len(seeds))
        rate = sum(lengths) / task_seconds
        print(
            f"{task:<24} {solved / len(seeds):>8.0%} {f'[{low:.0%}, {high:.0%}]':>15} "
            f"{sum(lengths) / len(lengths):>6.0f} {rate:>8.0f}"
        )
        results[f"{task.removesuffix('-v3')}_success"] = solved / len(seeds)
        steps_total += sum(lengths)
        step_seconds += task_seconds
        successes += solved
    episodes = len(seeds) * len(MT10_TASKS)
    results["mt10_success"] = successes / episodes
    results["steps_per_s"] = steps_total / step_seconds
    results["reset_s"] = reset_seconds / episodes
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds per task")
    parser.add_argument("--seeds", type=int, default=5, help="episodes per task")
    parser.add_argument("--camera", default="corner2", help="Meta-World camera to render")
    parser.add_argument("--size", type=int, default=64, help="image side, px")
    args = parser.parse_args()
    seeds = episode_seeds(0, 2 if args.quick else args.seeds, "benchmark")
    try:
        tick = time.perf_counter()
        with MetaWorldEnv(args.camera, args.size) as env:
            start = time.perf_counter() - tick
            results = measure(env, seeds)
    except RoboPipeError as err:  # a missing environment, an unknown camera: exit 2
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    print(
        f"seeds={len(seeds)} camera={args.camera} size={args.size} start_s={start:.1f} "
        + " ".join(f"{k}={v:.3g}" for k, v in results.items())
        + f" load={os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
