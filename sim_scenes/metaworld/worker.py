"""The Meta-World worker process: Meta-World's tasks, their scripted experts and fast camera
images, served over :mod:`sim_scenes.worker_protocol`.

Started by :class:`sim_scenes.metaworld.client.MetaWorldEnv` with the Meta-World environment's
Python (``make metaworld-env``): ``python -m sim_scenes.metaworld.worker --fd N`` where ``N``
is its end of a socket pair. Meta-World's own output goes to this process's stdout/stderr; only
protocol messages travel on the socket. The worker exits when the parent closes the socket or
sends ``close``. It serves one episode at a time, of any task: each task's env is built on its
first reset and kept.

Operations (request -> reply):

- ``init`` (camera: str, image_size: int) -> ``ready`` (seconds: float, tasks: list of every
  Meta-World task name), or ``refused`` (an unknown camera; the worker then exits).
- ``reset`` (task: str, seed: int) -> ``obs`` plus max_steps (int: the task's episode cap).
- ``step`` (action: float32 (4,)) -> ``obs`` plus reward (float), success (bool: the task's
  ``info["success"]``), truncated (bool: the episode reached max_steps).
- ``expert`` -> ``action`` (action: float32 (4,): the task's scripted expert on the current
  observation, clipped to the action space).
- ``close`` -> ``closed``.

``obs`` carries state (float32 (4,): the Sawyer's hand position, m, and gripper opening),
env_state (float32 (39,): Meta-World's whole observation: hand, gripper, object poses, the
previous frame's and the goal) and image (uint8 (image_size, image_size, 3), upright).
A request naming an unknown task or camera replies ``refused`` with ``reason`` (str); any other
failure replies ``error`` with ``traceback`` (str).
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

# Chosen before mujoco loads: EGL (or OSMesa) renders offscreen without a display. llvmpipe's
# own rasteriser threads cost more than they save on 64 px frames (sim_scenes/mujoco/rendering).
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("LP_NUM_THREADS", "0")

import mujoco
import numpy as np

from sim_scenes.worker_protocol import receive, run_worker, send

STATE_DIM = 4
"""The Sawyer's own state at the front of Meta-World's observation: hand xyz (m), gripper."""


class Refused(ValueError):
    """A request named something the worker does not have (replied as ``refused``)."""


@dataclass
class Task:
    """One task's env, its scripted expert and a renderer for its model."""

    env: Any
    expert: Any
    renderer: mujoco.Renderer
    camera_id: int
    upright: bool = False
    """Rotate images 180 degrees: the camera is mounted upside down (Meta-World's corner
    cameras), found from the camera's up axis after each reset."""
    obs: np.ndarray | None = None
    """Meta-World's last observation of this task's episode (the expert's input)."""


def build_task(name: str, camera: str, image_size: int) -> Task:
    """Task ``name``'s env with its goal observable (the MT benchmarks' setting), its expert, and
    a renderer with the fast settings for small frames.

    Meta-World's own benchmark classes (``gym.make("Meta-World/MT1", ...)``) draw each reset's
    layout from 50 goals fixed when the benchmark is built, chosen by an RNG that a reset's seed
    does not reach. robo-pipe needs a layout per episode seed (held-out seeds are new layouts),
    so the env draws each layout from its own RNG, seeded at every reset, over the same random
    reset space the benchmark's goals are drawn from.
    """
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE
    from metaworld.policies import ENV_POLICY_MAP

    env = ALL_V3_ENVIRONMENTS_GOAL_OBSERVABLE[f"{name}-goal-observable"]()
    env._freeze_rand_vec = False  # a new layout at each reset ...
    env.seeded_rand_vec = True  # ... drawn from env.np_random, which reset() seeds
    model = env.model
    camera_id = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, camera)
    if camera_id < 0:
        cameras = [model.camera(i).name for i in range(model.ncam)]
        raise Refused(f"camera {camera!r} is not in Meta-World's scene; valid: {cameras}")
    # No shadows, no multisampling, an offscreen buffer the size of the image (FACTS: ~70x
    # faster on software GL), and no reflections: the table's mirror pass drew the scene twice
    # (13.9 -> 8.4 ms a 64 px frame; most of the rest is the Sawyer's 67k-face meshes).
    model.vis.quality.shadowsize = 0
    model.vis.quality.offsamples = 0
    model.vis.global_.offwidth = image_size
    model.vis.global_.offheight = image_size
    renderer = mujoco.Renderer(model, image_size, image_size)
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    return Task(env, ENV_POLICY_MAP[name](), renderer, camera_id)


def observation(task: Task, obs: np.ndarray) -> dict[str, Any]:
    """The ``obs`` fields: state, env_state and the camera image of the current physics."""
    task.renderer.update_scene(task.env.data, camera=task.camera_id)
    # update_scene keeps the scene's flags; render() returns rows top-down
    image = task.renderer.render()
    if task.upright:
        image = image[::-1, ::-1]
    return {
        "state": obs[:STATE_DIM].astype(np.float32),
        "env_state": obs.astype(np.float32),
        "image": np.ascontiguousarray(image),
    }


def serve(conn: Connection) -> None:
    """Answer requests (``init`` first) until ``close`` or end-of-file."""
    op, init = receive(conn)
    if op != "init":
        raise RuntimeError(f"the first message must be init, got {op!r}")
    start = time.perf_counter()
    from metaworld.asset_path_utils import full_V3_path_for
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    names = sorted(ALL_V3_ENVIRONMENTS)
    camera, image_size = str(init["camera"]), int(init["image_size"])
    # Every task's scene includes the same Sawyer base (xyz_base.xml), cameras and all: one
    # scene's list checks the camera before any episode.
    base = mujoco.MjModel.from_xml_path(full_V3_path_for("sawyer_xyz/sawyer_reach_v3.xml"))
    cameras = [base.camera(i).name for i in range(base.ncam)]
    if camera not in cameras:
        reason = f"camera {camera!r} is not in Meta-World's scene; valid: {cameras}"
        send(conn, "refused", reason=reason)
        return
    tasks: dict[str, Task] = {}
    current: Task | None = None
    fovy = {base.camera(i).name: float(base.cam_fovy[i]) for i in range(base.ncam)}
    send(conn, "ready", seconds=time.perf_counter() - start, tasks=names, camera_fovy=fovy)
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
                    name = str(msg["task"])
                    if name not in ALL_V3_ENVIRONMENTS:
                        raise Refused(f"unknown Meta-World task {name!r}; valid: {names}")
                    if name not in tasks:
                        tasks[name] = build_task(name, camera, image_size)
                    current = tasks[name]
                    current.env.seed(int(msg["seed"]))
                    obs, _ = current.env.reset()
                    current.obs = obs  # what the expert reads
                    up_axis = current.env.data.cam_xmat[current.camera_id].reshape(3, 3)[:, 1]
                    current.upright = bool(up_axis[2] < 0)
                    send(
                        conn,
                        "obs",
                        **observation(current, obs),
                        max_steps=int(current.env.max_path_length),
                        # What the declared robot (robots/sawyer) states: a test compares them.
                        control_period_s=float(current.env.dt),
                        action_scale=float(current.env.action_scale),
                    )
                elif op in ("step", "expert") and current is None:
                    raise RuntimeError(f"{op} before the first reset")
                elif op == "step":
                    assert current is not None
                    action = np.asarray(msg["action"], np.float64)
                    obs, reward, _, truncated, info = current.env.step(action)
                    current.obs = obs
                    send(
                        conn,
                        "obs",
                        **observation(current, obs),
                        reward=float(reward),
                        success=bool(info["success"]),
                        truncated=bool(truncated),
                    )
                elif op == "expert":
                    assert current is not None and current.obs is not None
                    action = np.clip(current.expert.get_action(current.obs), -1.0, 1.0)
                    send(conn, "action", action=action.astype(np.float32))
                else:
                    raise ValueError(f"unknown operation {op!r}")
            except Refused as refusal:
                send(conn, "refused", reason=str(refusal))
            except Exception:
                send(conn, "error", traceback=traceback.format_exc())
    finally:
        for task in tasks.values():  # renderers before exit (OSMesa's __del__ fails late)
            task.renderer.close()
            task.env.close()


if __name__ == "__main__":
    run_worker(serve, __doc__)
