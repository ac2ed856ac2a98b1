"""Do Isaac Lab and MuJoCo agree? The same seeded episodes on both backends, paired.

Plays the scripted expert (physics only) and, with ``--policy``, an exported policy (its own
cameras) on the same evaluation seeds of each variant in MuJoCo and in Isaac Lab (kit-less,
Newton, CPU unless ``--device``), and prints per variant and backend the success rate with its
95% Wilson interval, then the paired comparison: episodes solved on one backend only, and the
exact McNemar p-value (two-sided) of "both backends have the same success probability". A p-value
under 0.05 is a disagreement beyond sampling error, to be explained (contacts, servo gains,
timing, rendering), not hidden.

Run: ``python benchmarks/isaaclab_agreement.py [--quick] [--episodes N] [--policy EXPORT_DIR]``
(needs ``make isaaclab-env``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedEnv, BatchedObservation
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.episodes import ActFn, play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.seeds import episode_seeds
from sim_scenes.touch import heldout_variants
from stages.statistics import wilson_interval


def mcnemar_exact(only_a: int, only_b: int) -> float:
    """Two-sided exact McNemar p-value from the discordant pair counts (scipy's binomtest)."""
    from scipy.stats import binomtest

    n = only_a + only_b
    return 1.0 if n == 0 else float(binomtest(only_a, n, 0.5).pvalue)


def play(
    backend: str,
    variant: str,
    act: ActFn,
    seeds: list[int],
    cameras: tuple[str, ...],
    image_size: int,
    envs: int,
    device: str,
) -> tuple[np.ndarray, float]:
    """Success per seed and seconds, on one backend."""
    robot = get_robot("rp5")
    scene = SceneConfig(variant=variant, cameras=list(cameras) or ["scene"], image_size=image_size)
    sim = SimConfig(backend=backend, num_envs=envs, device=device)
    with make_env(robot, scene, sim, cameras=cameras, autoreset=False) as env:
        start = time.perf_counter()
        records = play_episodes(env, act, seeds)
        return np.array([r.success for r in records]), time.perf_counter() - start


def report(
    label: str, variant: str, results: dict[str, np.ndarray], seconds: dict[str, float]
) -> dict:
    row = {}
    for backend, success in results.items():
        low, high = wilson_interval(int(success.sum()), len(success))
        row[backend] = success.mean()
        print(
            f"{label:<8} {variant:<22} {backend:<9} {success.mean():>7.1%}  "
            f"[{low:.1%}, {high:.1%}]  {seconds[backend]:>6.1f} s"
        )
    mj, il = results["mujoco"], results["isaaclab"]
    only_mj, only_il = int((mj & ~il).sum()), int((il & ~mj).sum())
    p = mcnemar_exact(only_mj, only_il)
    print(
        f"{label:<8} {variant:<22} paired: solved only in MuJoCo {only_mj}, only in Isaac Lab "
        f"{only_il}, McNemar p={p:.3f} ({'agree' if p >= 0.05 else 'DISAGREE'})"
    )
    row["p"] = p
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="40 episodes per variant")
    parser.add_argument("--episodes", type=int, default=200, help="episodes per variant")
    parser.add_argument("--envs", type=int, default=20, help="environments per backend")
    parser.add_argument(
        "--policy", type=Path, help="an export directory (model.onnx) to evaluate too"
    )
    parser.add_argument("--device", default="cpu", help="Isaac Lab device: cpu or cuda[:K]")
    args = parser.parse_args()
    episodes = 40 if args.quick else args.episodes
    seeds = episode_seeds(0, episodes, "eval")
    variants = ["touch-mixed", *heldout_variants("touch-mixed")]
    robot = get_robot("rp5")
    summary: dict[str, float] = {}

    expert = ScriptedExpert(robot)
    for variant in variants:
        results, seconds = {}, {}
        for backend in ("mujoco", "isaaclab"):
            results[backend], seconds[backend] = play(
                backend, variant, expert, seeds, (), 64, args.envs, args.device
            )
        row = report("expert", variant, results, seconds)
        summary[f"expert_{variant}_mujoco"] = row["mujoco"]
        summary[f"expert_{variant}_isaaclab"] = row["isaaclab"]
        summary[f"expert_{variant}_p"] = row["p"]

    if args.policy is not None:
        from stages.evaluate.policies import load_acting_policy

        policy = load_acting_policy(args.policy)

        def act(_: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
            return policy.predict_chunk(obs)[:, 0]

        for variant in variants:
            results, seconds = {}, {}
            for backend in ("mujoco", "isaaclab"):
                results[backend], seconds[backend] = play(
                    backend,
                    variant,
                    act,
                    seeds,
                    tuple(policy.cameras),
                    policy.image_size,
                    args.envs,
                    args.device,
                )
            row = report("policy", variant, results, seconds)
            summary[f"policy_{variant}_mujoco"] = row["mujoco"]
            summary[f"policy_{variant}_isaaclab"] = row["isaaclab"]
            summary[f"policy_{variant}_p"] = row["p"]

    print(f"episodes={episodes} " + " ".join(f"{k}={v:.3f}" for k, v in summary.items()))


if __name__ == "__main__":
    main()
