"""Meta-World's tasks seen from robo-pipe: :class:`MetaWorldEnv` starts
:mod:`sim_scenes.metaworld.worker` in the Meta-World environment (``make metaworld-env``) and
forwards every call over a socket pair (:mod:`sim_scenes.worker_protocol`).

Meta-World pins an older MuJoCo than robo-pipe's, so it never loads into this process. One
worker plays one episode at a time, of any Meta-World task (the MT10 benchmark's ten are
:data:`MT10_TASKS`): a reset names the task and the episode's seed, which fixes the layout (the
same seed, the same episode, whatever ran before it). Actions are Meta-World's 4-D ones: hand
displacement (x, y, z) and gripper effort, each in [-1, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import TracebackType

import numpy as np

from sim_scenes.errors import SceneError
from sim_scenes.metaworld.env import metaworld_python
from sim_scenes.worker_process import WorkerError, WorkerProcess

MT10_TASKS = (
    "reach-v3",
    "push-v3",
    "pick-place-v3",
    "door-open-v3",
    "drawer-open-v3",
    "drawer-close-v3",
    "button-press-topdown-v3",
    "peg-insert-side-v3",
    "window-open-v3",
    "window-close-v3",
)
"""The MT10 benchmark's tasks (Meta-World's ``MT10_V3``), in its order."""

ACTION_DIM = 4
START_TIMEOUT_S = 120.0
"""Seconds to wait for the worker to start (~1 s; a busy machine's first import is slower)."""
CALL_TIMEOUT_S = 120.0
"""Seconds to wait for one reply (a reset that builds a task's env takes ~1 s)."""


class MetaWorldWorkerError(WorkerError):
    """The Meta-World worker failed; the message carries its traceback and log tail."""


@dataclass(frozen=True)
class MetaWorldObservation:
    """What one camera and the robot see after a reset or a step."""

    state: np.ndarray
    """float32 (4,): the Sawyer's hand position (m) and gripper opening."""
    env_state: np.ndarray
    """float32 (39,): Meta-World's whole observation (hand, gripper, object poses, previous
    frame, goal), which the scripted experts read."""
    image: np.ndarray
    """uint8 (image_size, image_size, 3): the camera's frame, upright."""


@dataclass(frozen=True)
class MetaWorldStep:
    """One step's outcome."""

    obs: MetaWorldObservation
    reward: float
    success: bool
    """The task's own success test (``info["success"]``) on this step."""
    truncated: bool
    """The episode reached its task's step cap (:attr:`MetaWorldEnv.max_steps`)."""


class MetaWorldEnv:
    """Meta-World's tasks in a worker process, one episode at a time.

    Args:
        camera: the camera to render (Meta-World's scene has ``corner``, ``corner2``,
            ``corner3``, ``corner4``, ``topview``, ``behindGripper`` and ``gripperPOV``).
        image_size: square image side in pixels.

    Raises:
        MetaWorldMissingError: no Meta-World environment (before any process starts).
    """

    def __init__(self, camera: str = "corner2", image_size: int = 64) -> None:
        python = metaworld_python()
        if image_size < 1:
            raise SceneError(f"image_size must be at least 1 pixel, got {image_size}")
        self.camera, self.image_size = camera, image_size
        self.task: str | None = None
        """The current episode's task (None before the first reset)."""
        self.max_steps = 0
        """The current task's episode cap: steps after it are refused until the next reset."""
        self.steps = 0
        self._worker = WorkerProcess(
            python, "sim_scenes.metaworld.worker", "Meta-World worker", MetaWorldWorkerError
        )
        try:
            ready = self._worker.request(
                "init", "ready", START_TIMEOUT_S, camera=camera, image_size=image_size
            )
        except BaseException:
            self.close()
            raise
        self.tasks: tuple[str, ...] = tuple(ready["tasks"])
        """Every task Meta-World has (its v3 names)."""
        self.camera_fovy: dict[str, float] = dict(ready["camera_fovy"])
        """Every camera of Meta-World's scene and its vertical field of view, degrees."""
        self.control_period_s = math.nan
        """The current task's control period, s (its ``dt``: frame_skip x timestep)."""
        self.action_scale = math.nan
        """The current task's hand displacement per action unit, m."""

    def reset(self, task: str, seed: int) -> MetaWorldObservation:
        """Start an episode of ``task`` whose layout seed ``seed`` fixes.

        Raises:
            WorkerRefusal: an unknown task or camera (the message lists the valid ones).
        """
        fields = self._worker.request("reset", "obs", CALL_TIMEOUT_S, task=task, seed=int(seed))
        self.task, self.max_steps, self.steps = task, int(fields["max_steps"]), 0
        self.control_period_s = float(fields["control_period_s"])
        self.action_scale = float(fields["action_scale"])
        return _observation(fields)

    def step(self, action: np.ndarray) -> MetaWorldStep:
        """Apply one 4-D action (clipped to [-1, 1] by Meta-World)."""
        action = np.asarray(action, np.float32)
        if action.shape != (ACTION_DIM,):
            raise SceneError(f"a Meta-World action has shape ({ACTION_DIM},), got {action.shape}")
        if self.task is None:
            raise SceneError("reset the Meta-World env before stepping it")
        if self.steps >= self.max_steps:
            raise SceneError(f"the {self.task} episode ended at {self.max_steps} steps; reset")
        fields = self._worker.request("step", "obs", CALL_TIMEOUT_S, action=action)
        self.steps += 1
        return MetaWorldStep(
            obs=_observation(fields),
            reward=float(fields["reward"]),
            success=bool(fields["success"]),
            truncated=bool(fields["truncated"]),
        )

    def expert_action(self) -> np.ndarray:
        """The current task's scripted expert (``metaworld.policies``) on the current
        observation: float32 (4,), in [-1, 1]."""
        if self.task is None:
            raise SceneError("reset the Meta-World env before asking its expert")
        return self._worker.request("expert", "action", CALL_TIMEOUT_S)["action"]

    def close(self) -> None:
        """Stop the worker; safe to call twice."""
        self._worker.close()

    def __enter__(self) -> MetaWorldEnv:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_worker", None) is not None and not self._worker.closed:
            self.close()


def _observation(fields: dict[str, np.ndarray]) -> MetaWorldObservation:
    return MetaWorldObservation(
        state=fields["state"], env_state=fields["env_state"], image=fields["image"]
    )
