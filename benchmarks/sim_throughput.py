"""How fast is the batched MuJoCo backend, and how close to raw ``mujoco.rollout``?

For 1, 16, 64 and 256 environments of the default task it measures env-steps/s (one env-step =
one control step = ``robot.substeps`` physics steps):

* ``ours``: :class:`MujocoBatchedEnv` physics only (actions in, observations out, rewards,
  success, autoreset);
* ``raw``: one ``mujoco.rollout`` call over the same models, initial states and thread count,
  for the whole horizon -- the native limit (the ratio ``ours/raw`` is our overhead);
* ``raw/step``: ``mujoco.rollout`` called once per control step, feeding the last state back --
  the limit for any closed-loop environment built on it (the solver warm start restarts each
  call);
* ``render``: our backend with one 64x64 camera rendered every step.

Targets on 2 cores: ours/raw >= 0.8; render >= 1,000 env-steps/s at 64 envs.

Each figure is the best of ``--repeats`` runs (default 3): this machine's timings vary by
10-20% from run to run, and the best run is the least disturbed one.

Run: ``python benchmarks/sim_throughput.py [--quick] [--threads 2] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import time

import mujoco
import numpy as np
from mujoco import rollout

from robots.spec import RobotSpec, get_robot
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.seeds import episode_seeds
from sim_scenes.touch import get_variant


def random_actions(robot: RobotSpec, n: int, steps: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    low, high = np.array(robot.action.low), np.array(robot.action.high)
    return rng.uniform(low, high, size=(steps, n, robot.action.dim))


def time_ours(
    robot: RobotSpec, n: int, steps: int, threads: int, cameras: tuple[str, ...]
) -> float:
    """env-steps/s of our backend over ``steps`` control steps (after one warm-up step)."""
    variant = get_variant("touch-mixed")
    actions = random_actions(robot, n, steps + 1)
    with MujocoBatchedEnv(robot, variant, n, cameras=cameras, num_threads=threads) as env:
        env.reset(episode_seeds(0, n, "benchmark"))
        env.step(actions[0])
        start = time.perf_counter()
        for a in actions[1:]:
            env.step(a)
        elapsed = time.perf_counter() - start
    return n * steps / elapsed


def time_raw(robot: RobotSpec, n: int, steps: int, threads: int) -> tuple[float, float]:
    """env-steps/s of native rollout over the same models and initial states.

    Returns (one call for the whole horizon, one call per control step).
    """
    variant = get_variant("touch-mixed")
    with MujocoBatchedEnv(robot, variant, n, cameras=(), num_threads=threads) as env:
        env.reset(episode_seeds(0, n, "benchmark"))
        models = env.models  # the very models our backend steps
        datas = [mujoco.MjData(models[0]) for _ in range(threads)]
        initial = env.physics_state
        arm_q = env.privileged()["arm_qpos"]
        index = env.scene_index
        nu = models[0].nu
        # Joint targets: the initial pose plus a random offset per control step, held for the
        # control period, like our backend's position targets.
        deltas = random_actions(robot, n, steps)[:, :, : len(robot.arm)].transpose(1, 0, 2)
        ctrl = np.zeros((n, steps, nu))
        ctrl[:, :, index.arm_actuators] = arm_q[:, None, :] + deltas
        ctrl = np.repeat(ctrl, robot.substeps, axis=1)
        sub = robot.substeps
        with rollout.Rollout(nthread=threads) as pool:
            pool.rollout(models, datas, initial, ctrl[:, :1])  # warm-up
            start = time.perf_counter()
            pool.rollout(models, datas, initial, ctrl)
            horizon = time.perf_counter() - start
            state = initial.copy()
            chunks = [np.ascontiguousarray(ctrl[:, k * sub : (k + 1) * sub]) for k in range(steps)]
            out = np.zeros((n, sub, initial.shape[1]))
            sensors = np.zeros((n, sub, models[0].nsensordata))
            start = time.perf_counter()
            for chunk in chunks:  # the leanest closed loop: preallocated, unchecked
                pool.rollout(
                    models,
                    datas,
                    state,
                    chunk,
                    skip_checks=True,
                    nstep=sub,
                    state=out,
                    sensordata=sensors,
                )
                state[:] = out[:, -1]
            per_step = time.perf_counter() - start
    return n * steps / horizon, n * steps / per_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps (about 20 s)")
    parser.add_argument("--threads", type=int, default=2, help="rollout threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="best of this many runs")
    args = parser.parse_args()
    robot = get_robot("rp5")
    env_counts = (1, 16, 64, 256)
    budget = 4_000 if args.quick else 20_000  # env-steps per physics measurement
    render_budget = 1_000 if args.quick else 5_000

    print(
        f"env-steps/s, rp5 touch-mixed, {robot.substeps} physics steps per env-step, "
        f"{args.threads} threads, best of {args.repeats}"
    )
    print(
        f"{'envs':>5} {'ours':>9} {'raw':>9} {'raw/step':>9} {'ours/raw':>9} "
        f"{'ours/raw-step':>14} {'render 64px':>12}"
    )
    headline: dict[str, str] = {}
    for n in env_counts:
        steps = max(20, budget // n)
        ours = max(time_ours(robot, n, steps, args.threads, ()) for _ in range(args.repeats))
        raws = [time_raw(robot, n, steps, args.threads) for _ in range(args.repeats)]
        raw, raw_step = max(r[0] for r in raws), max(r[1] for r in raws)
        render_steps = max(5, render_budget // n)
        render = max(
            time_ours(robot, n, render_steps, args.threads, ("scene",)) for _ in range(args.repeats)
        )
        print(
            f"{n:>5} {ours:>9,.0f} {raw:>9,.0f} {raw_step:>9,.0f} {ours / raw:>9.2f} "
            f"{ours / raw_step:>14.2f} {render:>12,.0f}"
        )
        headline[f"ratio_{n}"] = f"{ours / raw:.2f}"
        headline[f"physics_{n}"] = f"{ours:.0f}"
        headline[f"render_{n}"] = f"{render:.0f}"
    print(" ".join(f"{k}={v}" for k, v in headline.items()))


if __name__ == "__main__":
    main()
