"""Isaac Lab throughput next to MuJoCo: env-steps/s of the touch task, physics only and with one
camera, at several batch sizes, both backends in the same run.

An env-step is one control step (``robot.substeps`` physics steps, 100 ms of simulated time for
rp5) of one environment, with autoreset, under random joint-delta actions. Each configuration is
built, warmed up (``--warmup`` steps, not timed: Warp compiles kernels on first use), then timed
over ``--steps`` steps. Isaac Lab runs in its worker process, so its figures include the
observation transfer (the images) to robo-pipe's process, as evaluation sees them.

Run: ``python benchmarks/isaaclab_throughput.py [--quick] [--device cuda] [--envs 1024 4096]``
(needs ``make isaaclab-env``). On CPU the defaults are 64 and 512 environments; on a GPU pass
``--device cuda --envs 1024 2048 4096`` (MuJoCo then runs at the same sizes on the CPU).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.config import SceneConfig, SimConfig


def measure(
    backend: str, envs: int, cameras: tuple[str, ...], steps: int, warmup: int, device: str
) -> tuple[float, float]:
    """(env-steps/s, seconds to build the env) of one configuration."""
    robot = get_robot("rp5")
    scene = SceneConfig(variant="touch-mixed", cameras=["scene"], image_size=64)
    sim = SimConfig(backend=backend, num_envs=envs, num_threads=2, device=device)
    rng = np.random.default_rng(0)
    limit = robot.authored.max_joint_delta
    start = time.perf_counter()
    with make_env(robot, scene, sim, cameras=cameras, autoreset=True) as env:
        build = time.perf_counter() - start
        env.reset(list(range(envs)))

        def actions() -> np.ndarray:
            a = rng.uniform(-limit, limit, size=(envs, robot.action.dim))
            a[:, -1] = 0.02
            return a

        for _ in range(warmup):
            env.step(actions())
        tick = time.perf_counter()
        for _ in range(steps):
            env.step(actions())
        return envs * steps / (time.perf_counter() - tick), build


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer timed steps")
    parser.add_argument("--envs", type=int, nargs="+", default=[64, 512], help="batch sizes")
    parser.add_argument("--steps", type=int, default=20, help="timed control steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed control steps first")
    parser.add_argument("--device", default="cpu", help="Isaac Lab device: cpu or cuda[:K]")
    args = parser.parse_args()
    steps = 5 if args.quick else args.steps
    results: dict[str, float] = {}
    print(f"{'backend':<9} {'envs':>5} {'camera':<8} {'env-steps/s':>12} {'build s':>8}")
    for envs in args.envs:
        for cameras, label in (((), "none"), (("scene",), "64x64")):
            for backend in ("mujoco", "isaaclab"):
                rate, build = measure(backend, envs, cameras, steps, args.warmup, args.device)
                results[f"{backend}_{envs}_{'cam' if cameras else 'phys'}"] = rate
                print(f"{backend:<9} {envs:>5} {label:<8} {rate:>12,.0f} {build:>8.1f}")
            ratio = (
                results[f"isaaclab_{envs}_{'cam' if cameras else 'phys'}"]
                / results[f"mujoco_{envs}_{'cam' if cameras else 'phys'}"]
            )
            results[f"ratio_{envs}_{'cam' if cameras else 'phys'}"] = ratio
    print(
        f"device={args.device} steps={steps} "
        + " ".join(f"{k}={v:.2f}" for k, v in results.items())
    )


if __name__ == "__main__":
    main()
