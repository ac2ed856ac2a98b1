"""The simulator standing in for a physical arm, through the real-robot interface.

Code written against :class:`robots.Robot` (the control-loop runtime, the latency gate) runs
unchanged on this and on a real driver: same action and state units, same camera names. The
simulator is any backend (:mod:`sim_scenes.backends`); MuJoCo by default.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from robots.interface import Robot, RobotObservation
from robots.spec import RobotSpec, get_robot
from sim_scenes.backends import open_env
from sim_scenes.batched_env import BatchedEnv, BatchedObservation
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.tasks import TaskFamily, TaskVariant, resolve_task
from sim_scenes.touch import SceneError

ONE_THREAD = SimConfig(num_threads=1)
"""The default simulator: MuJoCo on one thread (one environment has nothing to share out)."""


class SimulatedRobot(Robot):
    """One environment of ``variant`` on the backend ``sim`` names (with its settings;
    ``sim.num_envs`` does not apply: it is one environment), behind the :class:`Robot`
    interface.

    Time is simulated: ``timestamp`` advances by one control period per ``act``. After the
    episode ends (success or step limit) the scene freezes: further actions are ignored, as a
    real cell's safety controller would hold the arm, until ``connect`` starts a new one.
    """

    def __init__(
        self,
        spec: RobotSpec,
        variant: TaskVariant,
        seed: int = 0,
        cameras: tuple[str, ...] = ("scene", "wrist"),
        image_size: int = 64,
        sim: SimConfig = ONE_THREAD,
    ) -> None:
        self.spec = spec
        self._variant, self._seed, self._sim = variant, seed, sim
        self._cameras, self._image_size = cameras, image_size
        self._env: BatchedEnv | None = None
        self._obs: BatchedObservation | None = None
        self._steps = 0
        self.done = False
        """Whether the episode has ended (see class docstring)."""
        self.success = False
        """Whether the episode ended in success."""

    @property
    def is_connected(self) -> bool:
        return self._env is not None

    @property
    def instruction(self) -> str:
        """The task instruction of the current episode."""
        if self._obs is None:
            raise SceneError("SimulatedRobot: call connect() first")
        return self._obs.instruction[0]

    @property
    def seed(self) -> int:
        """The seed of the current (or next) episode."""
        return self._seed

    @property
    def variant(self) -> TaskVariant:
        """The scene variant this arm plays (its task and layouts)."""
        return self._variant

    def connect(self) -> None:
        if self._env is None:
            self._env = open_env(
                self.spec,
                self._variant,
                self._sim,
                num_envs=1,
                cameras=self._cameras,
                image_size=self._image_size,
                autoreset=False,
            )
        self._obs = self._env.reset([self._seed])
        self._steps, self.done, self.success = 0, False, False

    def new_episode(self, seed: int) -> None:
        """Start the episode of ``seed`` (``connect`` with another seed)."""
        self._seed = seed
        self.connect()

    def expert_action(self, expert: Callable[..., np.ndarray]) -> np.ndarray:
        """What the task's scripted expert (``family.expert(spec)``) does now, shape
        ``(action.dim,)``: it reads the simulator's ground truth, as no real arm's could."""
        if self._env is None or self._obs is None:
            raise SceneError("SimulatedRobot: call connect() first")
        return np.asarray(expert(self._env, self._obs)[0], dtype=np.float64)

    def env_state(self, family: TaskFamily) -> np.ndarray:
        """The scene's ground truth the task records (``family.env_state_names``: touch's, the
        named object's centre in m), float32: what a lab's motion capture would measure."""
        if self._env is None:
            raise SceneError("SimulatedRobot: call connect() first")
        return np.asarray(family.env_state(self._env)[0], dtype=np.float32)

    def observe(self) -> RobotObservation:
        if self._obs is None:
            raise SceneError("SimulatedRobot: call connect() first")
        return RobotObservation(
            images={cam: img[0] for cam, img in self._obs.images.items()},
            state=self._obs.state[0].copy(),
            timestamp=self._steps / self.spec.control_hz,
        )

    def act(self, action: np.ndarray) -> None:
        if self._env is None:
            raise SceneError("SimulatedRobot: call connect() first")
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (self.spec.action.dim,):
            raise SceneError(
                f"action must have shape ({self.spec.action.dim},), got {action.shape}"
            )
        if self.done:
            return
        result = self._env.step(action[None, :])
        self._obs, self._steps = result.obs, self._steps + 1
        self.done = bool(result.terminated[0] or result.truncated[0])
        self.success = bool(result.success[0])

    def stop(self) -> None:
        if self._env is not None:
            self._env.close()
        self._env, self._obs = None, None


def simulated(
    cameras: tuple[str, ...], image_size: int, task: str = "touch-mixed", seed: int = 0
) -> SimulatedRobot:
    """The edge agent's simulated robot for any task (``sim_scenes.sim_robot:simulated``, its
    ``driver_args``: ``task``, ``[FAMILY/]VARIANT``, and the episode's ``seed``): the robot the
    task's family runs on, on the first backend the family plays, with a policy's cameras and
    image size.

    Raises:
        SceneError: an unknown task (the message lists the valid ones).
    """
    family, _ = resolve_task(task)
    sim = SimConfig(backend=family.backends[0], num_threads=1)
    return SimulatedRobot(
        get_robot(family.robot),
        SceneConfig(variant=task).task(),
        seed,
        tuple(cameras),
        image_size,
        sim,
    )


def simulated_rp5(cameras: tuple[str, ...], image_size: int) -> SimulatedRobot:
    """The edge agent's default driver (``sim_scenes.sim_robot:simulated_rp5``): rp5 on the
    demo's ``touch-mixed`` variant, seed 0 (:func:`simulated` with its defaults)."""
    return simulated(cameras, image_size)
