"""How reliable is the scripted expert? Success rate with a 95% Wilson interval per variant.

Plays ``--episodes`` seeded episodes (evaluation seed stream) of every scene variant with the
scripted expert, physics only, and prints success, interval, mean episode length and
throughput. The foundation issue's bar: >= 95% over >= 200 episodes of random scenes.

Run: ``python benchmarks/expert_success.py [--quick] [--episodes N]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from robots.spec import get_robot
from sim_scenes.episodes import play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.seeds import episode_seeds
from sim_scenes.touch import VARIANTS
from stages.statistics import wilson_interval


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 episodes per variant")
    parser.add_argument("--episodes", type=int, default=1000, help="episodes per variant")
    parser.add_argument("--envs", type=int, default=32, help="batched environments")
    args = parser.parse_args()
    episodes = 200 if args.quick else args.episodes
    robot = get_robot("rp5")
    expert = ScriptedExpert(robot)
    print(f"{'variant':<22} {'split':<8} {'success':>8} {'95% CI':>15} {'steps':>6} {'eps/s':>7}")
    rates = []
    for name, variant in VARIANTS.items():
        seeds = episode_seeds(0, episodes, "eval")
        with MujocoBatchedEnv(robot, variant, args.envs, cameras=(), autoreset=False) as env:
            start = time.perf_counter()
            records = play_episodes(env, expert, seeds)
            wall = time.perf_counter() - start
        wins = sum(r.success for r in records)
        low, high = wilson_interval(wins, len(records))
        length = np.mean([r.length for r in records])
        rates.append(wins / len(records))
        print(
            f"{name:<22} {variant.split:<8} {wins / len(records):>8.1%} "
            f"{f'{low:.1%}-{high:.1%}':>15} {length:>6.1f} {len(records) / wall:>7.0f}"
        )
    print(f"episodes={episodes} min_success={min(rates):.3f} mean_success={np.mean(rates):.3f}")


if __name__ == "__main__":
    main()
