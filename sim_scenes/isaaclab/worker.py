"""The Isaac Lab worker process: one :class:`~sim_scenes.isaaclab.touch_env.TouchEnv` served
over :mod:`sim_scenes.worker_protocol`.

Started by :class:`sim_scenes.isaaclab.client.IsaacLabBatchedEnv` with the Isaac Lab
environment's Python: ``python -m sim_scenes.isaaclab.worker --fd N`` where ``N`` is its end of a
socket pair. Isaac Lab's own logging goes to this process's stdout/stderr; only protocol messages
travel on the socket. The worker exits when the parent closes the socket or sends ``close``.

Operations (request -> reply; arrays batched over N environments):

- ``init`` (robot, variant, success_radius, hold_steps, episode_steps, reward (the variant's
  reward terms by field name), num_envs, cameras, image_size, device, retarget, phrasing,
  autoreset)
  -> ``ready`` (seconds: float).
- ``reset`` (env_ids, seeds: int64 (k,)) -> ``obs``.
- ``step`` (actions: float32 (N, action_dim)) -> ``obs`` plus reward (float32), terminated,
  truncated, success (bool), distance and distance_before (float32, m: tcp to target after and
  before the step).
- ``privileged`` -> ``privileged`` (tcp_pos, target_pos: (N, 3) m; arm_qpos: (N, n_arm) rad).
- ``close`` -> ``closed``.

``obs`` carries state (float32 (N, state_dim)), seeds (int64 (N,), each environment's current
episode), instructions (list of N str) and one uint8 (N, H, W, 3) array per camera, named
``image:<camera>``. A failure replies ``error`` with ``traceback`` (str).
"""

from __future__ import annotations

import time
import traceback
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

from sim_scenes.worker_protocol import receive, run_worker, send


def _observation(env: Any, obs: dict) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "state": obs["policy"].cpu().numpy().astype(np.float32),
        "seeds": env.seeds.copy(),
        "instructions": list(env.instructions),
    }
    for name, image in obs["images"].items():
        fields[f"image:{name}"] = image.cpu().numpy()
    return fields


def serve(conn: Connection) -> None:
    """Create the env the ``init`` message describes, then answer requests until ``close``."""
    op, init = receive(conn)
    if op != "init":
        raise RuntimeError(f"the first message must be init, got {op!r}")
    start = time.perf_counter()
    import torch
    from isaaclab.app import launch_simulation

    from sim_scenes.isaaclab.touch_env import TouchEnv
    from sim_scenes.isaaclab.touch_env_cfg import make_touch_cfg

    cfg = make_touch_cfg(
        robot_name=init["robot"],
        variant=init["variant"],
        success_radius=init["success_radius"],
        hold_steps=init["hold_steps"],
        episode_steps=init["episode_steps"],
        reward=init["reward"],
        num_envs=init["num_envs"],
        cameras=init["cameras"],
        image_size=init["image_size"],
        device=init["device"],
        retarget=init["retarget"],
        phrasing=init["phrasing"],
        autoreset=init["autoreset"],
    )
    with launch_simulation(cfg, {"visualizer": "none"}):
        env = TouchEnv(cfg)
        send(conn, "ready", seconds=time.perf_counter() - start)
        try:
            while True:
                try:
                    op, msg = receive(conn)
                except EOFError:
                    return
                try:
                    if op == "close":
                        send(conn, "closed")
                        return
                    if op == "reset":
                        ids = [int(i) for i in msg["env_ids"]]
                        if len(ids) == env.num_envs:
                            env.set_seeds(ids, msg["seeds"])
                            obs, _ = env.reset()
                        else:
                            obs = env.reset_envs(ids, msg["seeds"])
                        send(conn, "obs", **_observation(env, obs))
                    elif op == "step":
                        actions = torch.as_tensor(msg["actions"], dtype=torch.float32)
                        obs, reward, terminated, truncated, _ = env.step(actions.to(env.device))
                        send(
                            conn,
                            "obs",
                            **_observation(env, obs),
                            reward=reward.cpu().numpy().astype(np.float32),
                            terminated=terminated.cpu().numpy(),
                            truncated=truncated.cpu().numpy(),
                            success=env.success.cpu().numpy(),
                            distance=env.step_distance.cpu().numpy().astype(np.float32),
                            distractor=env.step_distractor_distance.cpu()
                            .numpy()
                            .astype(np.float32),
                            distance_before=env.distance_before.cpu().numpy().astype(np.float32),
                        )
                    elif op == "privileged":
                        send(
                            conn,
                            "privileged",
                            tcp_pos=env.tcp_pos().cpu().numpy(),
                            target_pos=env.target_pos().cpu().numpy(),
                            arm_qpos=env.arm_qpos().cpu().numpy(),
                        )
                    else:
                        raise ValueError(f"unknown operation {op!r}")
                except Exception:
                    send(conn, "error", traceback=traceback.format_exc())
        finally:
            env.close()


if __name__ == "__main__":
    run_worker(serve, __doc__)
