"""The batched-environment interface every simulator backend implements.

A backend is a :class:`BatchedEnv` subclass in a folder of its own (``sim_scenes/mujoco/``,
``sim_scenes/isaaclab/``), chosen by name through :mod:`sim_scenes.backends`.

N environments step in lock-step. Arrays are batched along the first axis (``N = num_envs``).
Units follow :mod:`robots.spec`: actions are joint deltas in rad plus a gripper opening in m;
state is joint positions in rad plus the gripper opening in m; images are uint8 RGB.

Finished environments reset themselves inside ``step`` ("same-step autoreset"): for an env whose
``terminated | truncated`` is true, the returned observation is already the first observation of
its next episode, and the finished episode's summary is in ``info["final"]``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from robo_pipe.resources import Resource
from robots.spec import RobotSpec
from sim_scenes.tasks import TaskVariant
from sim_scenes.touch import PHRASINGS, Phrasing, SceneError

if TYPE_CHECKING:
    from sim_scenes.config import SimConfig


@dataclass
class BatchedObservation:
    """Observations of N environments.

    Attributes:
        images: camera name -> uint8 array ``(N, H, W, 3)``; empty when no camera is rendered.
        state: float32 ``(N, state_dim)``: joint positions (rad), gripper opening (m).
        instruction: N natural-language instructions, one per environment.
    """

    images: dict[str, np.ndarray]
    state: np.ndarray
    instruction: list[str]


@dataclass
class EpisodeSummary:
    """Summary of episodes that ended in a step, for the envs in ``env_ids``."""

    env_ids: np.ndarray
    """int64 (k,): which environments finished."""
    seeds: np.ndarray
    """int64 (k,): the seeds of the finished episodes."""
    success: np.ndarray
    """bool (k,)."""
    length: np.ndarray
    """int64 (k,): control steps taken."""
    episode_return: np.ndarray
    """float32 (k,): undiscounted sum of rewards."""


@dataclass
class StepResult:
    """What ``step`` returns.

    Attributes:
        obs: observations after the step (next episode's first one for finished envs).
        reward: float32 ``(N,)``.
        terminated: bool ``(N,)``: the episode ended by success.
        truncated: bool ``(N,)``: the episode hit its step limit.
        success: bool ``(N,)``: solved on this step (equals ``terminated`` for the touch task).
        final: summaries of the episodes that ended on this step.
        info: per-env extras, float ``(N,)`` in m: ``tcp_target_distance`` and
            ``tcp_target_distance_before`` (tool centre point to the named object's centre,
            after and before the step; what rewards use) and ``tcp_distractor_distance``
            (to the nearest other object's centre after the step, inf if there is none; what
            tells a wrong-object failure from a near miss). Backends that do not report one
            leave it out.
    """

    obs: BatchedObservation
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    final: EpisodeSummary
    info: dict[str, np.ndarray] = field(default_factory=dict)


class BatchedEnv(Resource):
    """N environments of one scene variant, stepped together at the robot's control rate.

    Args:
        robot: the robot to simulate.
        variant: the scene distribution episodes are drawn from (the task,
            its family's variant, :class:`sim_scenes.tasks.TaskVariant`).
        num_envs: N >= 1.
        cameras: cameras rendered each step (subset of ``robot.cameras``); ``()`` for physics
            only.
        image_size: square image side in pixels (>= 8).
        autoreset: reset finished environments inside ``step`` (see the module docstring).
        retarget: > 0 names another object of each scene than the drawn target
            (:func:`sim_scenes.touch.sample_layout`).
        phrasing: ``trained`` (default) or ``unseen``: how instructions are worded
            (:func:`sim_scenes.touch.sample_layout`; unseen is for evaluation only).

    Raises:
        SceneError: a batch size, camera name, image size or phrasing no backend can use.
    """

    timings: dict[str, float]
    """Cumulative seconds per phase (``simulate``, ``render``), for throughput breakdowns."""

    def __init__(
        self,
        robot: RobotSpec,
        variant: TaskVariant,
        num_envs: int,
        cameras: Sequence[str],
        image_size: int,
        autoreset: bool,
        retarget: int,
        phrasing: Phrasing,
    ) -> None:
        if num_envs < 1:
            raise SceneError(f"num_envs must be >= 1, got {num_envs}")
        if image_size < 8:
            raise SceneError(f"image_size must be >= 8 pixels, got {image_size}")
        if phrasing not in PHRASINGS:
            raise SceneError(
                f"unknown phrasing {phrasing!r}; valid choices: {', '.join(PHRASINGS)}"
            )
        known = [c.name for c in robot.cameras]
        for cam in cameras:
            if cam not in known:
                raise SceneError(
                    f"unknown camera {cam!r} for robot {robot.name!r}; valid choices: "
                    f"{', '.join(known)}"
                )
        self.robot = robot
        self.variant = variant
        self.num_envs = num_envs
        self.cameras = tuple(cameras)
        self.image_size = image_size
        self.autoreset = autoreset
        self.retarget = retarget
        self.phrasing = phrasing
        self.timings = {"simulate": 0.0, "render": 0.0}

    # -- the backend, as the registry (sim_scenes.backends) sees it ----------------------------

    @classmethod
    @abc.abstractmethod
    def sim_options(cls, sim: SimConfig) -> dict[str, Any]:
        """The keyword arguments its constructor takes from the ``sim:`` section besides the
        ones every backend takes (MuJoCo: its physics threads; Isaac Lab: its device)."""

    @classmethod
    @abc.abstractmethod
    def simulator_version(cls, sim: SimConfig) -> str:
        """The simulator and its version, e.g. ``mujoco==3.3.0``: part of what decides an
        episode, so stored evaluation outcomes are keyed on it."""

    @classmethod
    @abc.abstractmethod
    def check_available(cls, sim: SimConfig) -> None:
        """Raise a :class:`~robo_pipe.errors.RoboPipeError` that says how to fix it when this
        backend cannot start on this machine (checked before a run starts)."""

    # -- the environments ------------------------------------------------------------------

    def reset(self, seeds: Sequence[int]) -> BatchedObservation:
        """Start a new episode in every environment; ``seeds`` has one seed per environment.

        The same seeds always give the same scenes and the same observations. This default
        is :meth:`reset_envs` on every environment.
        """
        if len(seeds) != self.num_envs:
            raise SceneError(f"reset needs {self.num_envs} seeds (one per env), got {len(seeds)}")
        return self.reset_envs(range(self.num_envs), seeds)

    @abc.abstractmethod
    def reset_envs(self, env_ids: Sequence[int], seeds: Sequence[int]) -> BatchedObservation:
        """Start new episodes in the given environments only; return all observations."""

    @abc.abstractmethod
    def step(self, actions: np.ndarray) -> StepResult:
        """Apply ``actions`` (float ``(N, action_dim)``, robot units) for one control period."""

    @abc.abstractmethod
    def privileged(self) -> dict[str, np.ndarray]:
        """Simulator-only ground truth for scripted experts and rewards (never for policies).

        Keys: ``tcp_pos`` (N, 3) m; ``target_pos`` (N, 3) m; ``arm_qpos`` (N, n_arm) rad.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release renderers and worker threads; the env is unusable afterwards."""
