"""The Meta-World worker process: Meta-World's tasks, their scripted experts and fast camera
images, for K environments ("slots") stepped together, served over
:mod:`sim_scenes.worker_protocol`.

Started by :class:`sim_scenes.metaworld.batched.MetaWorldBatchedEnv` with the Meta-World
environment's Python (``make metaworld-env``): ``python -m sim_scenes.metaworld.worker --fd N``
where ``N`` is its end of a socket pair. Meta-World's own output goes to this process's
stdout/stderr; only protocol messages travel on the socket. The worker exits when the parent
closes the socket or sends ``close``. Each slot plays one episode at a time, of any task: a
slot's env for a task is built on that slot's first reset of it and kept.

Operations (request -> reply); arrays have one row per slot (K rows) unless said otherwise:

- ``init`` (cameras: list of str, Meta-World's or :data:`WORKSPACE`; image_size: int; slots:
  int) -> ``ready`` (seconds: float,
  tasks: every Meta-World task name, camera_fovy: camera name -> vertical field of view, deg),
  or ``refused`` (an unknown camera; the worker then exits).
- ``reset`` (slots: int64 (k,), tasks: k task names, seeds: int64 (k,); k >= 1) -> ``obs`` of
  every slot, plus control_period_s and action_scale (floats, the last reset task's).
- ``step`` (actions: float32 (K, 4)) -> ``obs`` plus reward (float32 (K,)) and success (bool
  (K,): the task's ``info["success"]``). Meta-World's other ``info`` values mean different
  things in different tasks (reach's ``near_object`` is a distance, door-open's a reward), so
  the client measures what it needs from the observation instead.
- ``expert`` -> ``action`` (actions: float32 (K, 4): each slot's task's scripted expert on its
  current observation, clipped to the action space).
- ``close`` -> ``closed``.

``obs`` carries state (float32 (K, 7): the Sawyer's hand position, m, its gripper opening and
the goal's position, m),
observation (float32 (K, 39): Meta-World's whole observation: hand, gripper, object poses, the
previous frame's and the goal), max_steps (int64 (K,): each slot's task's own episode cap) and
``image:<camera>`` (uint8 (K, image_size, image_size, 3), upright). A request naming an unknown
task replies ``refused`` with ``reason`` (str); any other failure replies ``error`` with
``traceback`` (str).
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

# Chosen before mujoco loads: EGL (or OSMesa) renders offscreen without a display. llvmpipe's
# own rasteriser threads cost more than they save on 64 px frames (sim_scenes/mujoco/rendering).
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("LP_NUM_THREADS", "0")

import mujoco
import numpy as np

from sim_scenes.worker_protocol import receive, run_worker, send

STATE = (0, 1, 2, 3, 36, 37, 38)
"""Where Meta-World's observation holds the policy's state (robots/sawyer): the Sawyer's hand
xyz (m) and gripper opening at its front, and the goal's xyz (m) at its end. MT10 is the
goal-observable benchmark (the goal is part of its observation); the goal marker in a 64 px
image is a few pixels, where a puck or a handle is several times larger."""
WORKSPACE = "workspace"
"""robo-pipe's own camera (not in Meta-World's scene): a free camera framing the table's
workspace from Meta-World's corner2 side. corner2 frames the whole robot, table and floor, so at
64 px a puck or a goal is a pixel or two; this one shows them ~3x larger, every MT10 object in
view over the layouts the tasks draw."""
WORKSPACE_VIEW = {
    "lookat": (0.0, 0.68, 0.05),
    "azimuth": 150.0,
    "elevation": -40.0,
    "distance": 1.05,
}
"""Its pose: the point it looks at (m, world frame), azimuth and elevation (deg), distance (m)."""
GOAL_MARKER_SCALE = 2.5
"""The goal marker (Meta-World's ``goal`` site: a 2 cm sphere, drawn only, never touched) is
drawn this much larger: at 64 px the goal a reach, push or pick-place must end at is otherwise
two pixels. Sites take no part in physics or success."""


class Refused(ValueError):
    """A request named something the worker does not have (replied as ``refused``)."""


def workspace_camera() -> mujoco.MjvCamera:
    """:data:`WORKSPACE` as a free camera (its field of view: the model's ``vis.global_.fovy``)."""
    camera = mujoco.MjvCamera()
    camera.type = mujoco.mjtCamera.mjCAMERA_FREE
    camera.lookat[:] = WORKSPACE_VIEW["lookat"]
    camera.azimuth = WORKSPACE_VIEW["azimuth"]
    camera.elevation = WORKSPACE_VIEW["elevation"]
    camera.distance = WORKSPACE_VIEW["distance"]
    return camera


@dataclass
class Task:
    """One slot's env of one task, its scripted expert and a renderer for its model."""

    env: Any
    expert: Any
    renderer: mujoco.Renderer
    camera_ids: list[int | mujoco.MjvCamera]
    upright: list[bool] = field(default_factory=list)
    """Per camera: rotate images 180 degrees (the camera is mounted upside down, as Meta-World's
    corner cameras are), found from the camera's up axis after each reset."""
    obs: np.ndarray | None = None
    """Meta-World's last observation of this env's episode (the expert's input)."""


def build_task(name: str, cameras: list[str], image_size: int) -> Task:
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
    # No shadows, no multisampling, an offscreen buffer the size of the image (FACTS: ~70x
    # faster on software GL), and no reflections: the table's mirror pass drew the scene twice
    # (13.9 -> 8.4 ms a 64 px frame; most of the rest is the Sawyer's 67k-face meshes).
    goal = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, "goal")
    if goal >= 0:
        model.site_size[goal] *= GOAL_MARKER_SCALE
    model.vis.quality.shadowsize = 0
    model.vis.quality.offsamples = 0
    model.vis.global_.offwidth = image_size
    model.vis.global_.offheight = image_size
    renderer = mujoco.Renderer(model, image_size, image_size)
    renderer.scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
    ids: list[int | mujoco.MjvCamera] = [
        workspace_camera()
        if c == WORKSPACE
        else mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, c)
        for c in cameras
    ]
    return Task(env, ENV_POLICY_MAP[name](), renderer, ids)


def render(task: Task, cameras: list[str]) -> dict[str, np.ndarray]:
    """Each camera's frame of the current physics, upright, by ``image:<camera>``."""
    images = {}
    for camera, camera_id, upright in zip(cameras, task.camera_ids, task.upright, strict=True):
        task.renderer.update_scene(task.env.data, camera=camera_id)
        image = task.renderer.render()  # rows top-down
        images[f"image:{camera}"] = image[::-1, ::-1] if upright else image
    return images


class Slots:
    """K environments, each playing its own task's episode."""

    def __init__(self, count: int, cameras: list[str], image_size: int, names: list[str]):
        self.cameras, self.image_size, self.names = cameras, image_size, names
        self.built: list[dict[str, Task]] = [{} for _ in range(count)]
        self.current: list[Task | None] = [None] * count
        self.images = {
            f"image:{c}": np.zeros((count, image_size, image_size, 3), np.uint8) for c in cameras
        }
        self.observation = np.zeros((count, 39), np.float32)
        self.max_steps = np.zeros(count, np.int64)

    def _record(self, slot: int, task: Task, obs: np.ndarray) -> None:
        task.obs = obs
        self.observation[slot] = obs
        for key, image in render(task, self.cameras).items():
            self.images[key][slot] = image

    def obs_fields(self) -> dict[str, Any]:
        return {
            "state": self.observation[:, STATE].copy(),
            "observation": self.observation.copy(),
            "max_steps": self.max_steps.copy(),
            **{key: images.copy() for key, images in self.images.items()},
        }

    def reset(self, slot: int, name: str, seed: int) -> Task:
        if name not in self.names:
            raise Refused(f"unknown Meta-World task {name!r}; valid: {self.names}")
        if name not in self.built[slot]:
            self.built[slot][name] = build_task(name, self.cameras, self.image_size)
        task = self.current[slot] = self.built[slot][name]
        task.env.seed(seed)
        obs, _ = task.env.reset()
        task.upright = [
            isinstance(i, int) and bool(task.env.data.cam_xmat[i].reshape(3, 3)[2, 1] < 0)
            for i in task.camera_ids
        ]
        self.max_steps[slot] = int(task.env.max_path_length)
        self._record(slot, task, obs)
        return task

    def step(self, actions: np.ndarray) -> dict[str, np.ndarray]:
        count = len(self.current)
        out = {"reward": np.zeros(count, np.float32), "success": np.zeros(count, bool)}
        for slot, task in enumerate(self.current):
            if task is None:
                continue  # never reset: it has no episode (its row stays zero)
            obs, reward, _, _, info = task.env.step(np.asarray(actions[slot], np.float64))
            self._record(slot, task, obs)
            out["reward"][slot], out["success"][slot] = reward, bool(info["success"])
        return out

    def expert(self) -> np.ndarray:
        actions = np.zeros((len(self.current), 4), np.float32)
        for slot, task in enumerate(self.current):
            if task is not None and task.obs is not None:
                actions[slot] = np.clip(task.expert.get_action(task.obs), -1.0, 1.0)
        return actions

    def close(self) -> None:
        for built in self.built:  # renderers before exit (OSMesa's __del__ fails late)
            for task in built.values():
                task.renderer.close()
                task.env.close()


def serve(conn: Connection) -> None:
    """Answer requests (``init`` first) until ``close`` or end-of-file."""
    op, init = receive(conn)
    if op != "init":
        raise RuntimeError(f"the first message must be init, got {op!r}")
    start = time.perf_counter()
    from metaworld.asset_path_utils import full_V3_path_for
    from metaworld.env_dict import ALL_V3_ENVIRONMENTS

    names = sorted(ALL_V3_ENVIRONMENTS)
    cameras, image_size = [str(c) for c in init["cameras"]], int(init["image_size"])
    # Every task's scene includes the same Sawyer base (xyz_base.xml), cameras and all: one
    # scene's list checks the cameras before any episode.
    base = mujoco.MjModel.from_xml_path(full_V3_path_for("sawyer_xyz/sawyer_reach_v3.xml"))
    known = [base.camera(i).name for i in range(base.ncam)] + [WORKSPACE]
    unknown = [c for c in cameras if c not in known]
    if unknown:
        send(
            conn,
            "refused",
            reason=f"camera {unknown[0]!r} is not in Meta-World's scene; valid: {known}",
        )
        return
    fovy = {base.camera(i).name: float(base.cam_fovy[i]) for i in range(base.ncam)}
    fovy[WORKSPACE] = float(base.vis.global_.fovy)
    slots = Slots(int(init["slots"]), cameras, image_size, names)
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
                    task = None
                    for slot, name, seed in zip(
                        msg["slots"], msg["tasks"], msg["seeds"], strict=True
                    ):
                        task = slots.reset(int(slot), str(name), int(seed))
                    assert task is not None, "a reset names at least one slot"
                    send(
                        conn,
                        "obs",
                        **slots.obs_fields(),
                        # What the declared robot (robots/sawyer) states: a test compares them.
                        control_period_s=float(task.env.dt),
                        action_scale=float(task.env.action_scale),
                    )
                elif op == "step":
                    out = slots.step(np.asarray(msg["actions"], np.float32))
                    send(conn, "obs", **slots.obs_fields(), **out)
                elif op == "expert":
                    send(conn, "action", actions=slots.expert())
                else:
                    raise ValueError(f"unknown operation {op!r}")
            except Refused as refusal:
                send(conn, "refused", reason=str(refusal))
            except Exception:
                send(conn, "error", traceback=traceback.format_exc())
    finally:
        slots.close()


if __name__ == "__main__":
    run_worker(serve, __doc__)
