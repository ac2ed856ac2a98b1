"""Demonstration sources: what produces the actions that become a dataset.

A source acts on a batched environment like a policy. The scripted expert reads simulator
ground truth; a teleoperation or real-robot source would implement the same call over a
:class:`robots.Robot` driver (the simulator stands behind that interface as
:class:`sim_scenes.sim_robot.SimulatedRobot`).
"""

from __future__ import annotations

import abc
from collections.abc import Callable

import numpy as np

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation
from sim_scenes.tasks import TaskFamily


class DemonstrationSource(abc.ABC):
    """Produces demonstration actions for every environment of a batched env."""

    name: str
    """Registry name, recorded in the dataset's provenance."""

    @abc.abstractmethod
    def __call__(self, env: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
        """Actions, shape ``(env.num_envs, robot.action.dim)``, in robot units."""


class ScriptedExpertSource(DemonstrationSource):
    """The task's scripted expert (:meth:`sim_scenes.tasks.TaskFamily.expert`; privileged)."""

    name = "scripted_expert"

    def __init__(self, robot: RobotSpec, task: TaskFamily) -> None:
        self._expert = task.expert(robot)

    def __call__(self, env: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
        return self._expert(env, obs)


SOURCES: dict[str, Callable[[RobotSpec, TaskFamily], DemonstrationSource]] = {
    "scripted_expert": ScriptedExpertSource,
}


def make_source(name: str, robot: RobotSpec, task: TaskFamily) -> DemonstrationSource:
    """Build a registered source for ``task`` on ``robot``; unknown names list the valid ones."""
    if name not in SOURCES:
        raise ValueError(
            f"unknown demonstration source {name!r}; valid choices: {', '.join(SOURCES)}"
        )
    return SOURCES[name](robot, task)
