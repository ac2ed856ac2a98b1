"""Running the active version on the device's robot: the health check's control ticks, an
episode, and the engine the policy server (``WS /policy``) shares.

The deployer decides *what* is active (:mod:`deploy_edge.agent.deployer`); this module runs it,
always as its slot says: the variant its deployment pinned or chose (``Slot.variant``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from deploy_edge.agent.config import DeviceConfig
from deploy_edge.agent.slots import SlotStore
from deploy_edge.agent.trials import Refused
from deploy_edge.bundle.io_spec import read_io_spec
from deploy_edge.exported import ExportedPolicy
from deploy_edge.latency import open_policy, target_loop
from deploy_edge.runtime import Tick
from deploy_edge.targets import TargetProfile, running_option
from deploy_edge.wire import EpisodeResult, Slot
from robots.interface import Robot, RobotObservation
from robots.spec import RobotSpec


class Served(NamedTuple):
    """What the policy server (``WS /policy``) serves: the active version's engine, its
    ``model:version``, and the spec of the device's robot its chunks are for (the actions'
    limits, :func:`robots.limits.action_fault`)."""

    policy: ExportedPolicy
    version: str
    spec: RobotSpec


class ShadowRobot(Robot):
    """A robot whose actions are computed but never sent: it observes through ``robot`` and
    keeps the last action (the health check's shadow mode on a real arm)."""

    def __init__(self, robot: Robot) -> None:
        self.robot, self.spec = robot, robot.spec
        self.last_action: np.ndarray | None = None

    def connect(self) -> None:
        self.robot.connect()

    def observe(self) -> RobotObservation:
        return self.robot.observe()

    def act(self, action: np.ndarray) -> None:
        self.last_action = np.asarray(action)  # held, not sent

    def stop(self) -> None:
        self.robot.stop()

    @property
    def is_connected(self) -> bool:
        return self.robot.is_connected


class ActiveVersion:
    """The active version of ``slots`` run on a fresh robot of ``driver`` at the target
    ``profile``'s control rate. The caller holds the robot (one user at a time); the serving
    engine is cached under a lock of its own."""

    def __init__(
        self,
        config: DeviceConfig,
        profile: TargetProfile,
        driver: Callable[..., Robot],
        slots: SlotStore,
    ) -> None:
        self.config, self.profile, self.driver, self.slots = config, profile, driver, slots
        self._serving: tuple[str, Served] | None = None
        """The policy server's engine: (active bundle path, what it serves), opened once per
        active version."""
        self._serving_lock = threading.Lock()

    def policy(self, slot: Slot | None) -> ExportedPolicy:
        """The active version as its slot says it runs: the variant its deployment pinned or
        chose (a slot recorded before variants: as the profile pins it; FP32 under auto)."""
        root = self.slots.state_dir / "active"
        recorded = (slot.variant, slot.precision) if slot is not None else ()
        return open_policy(
            root, self.profile, running_option(read_io_spec(root), self.profile, *recorded)
        )

    def control(
        self,
        instruction: str | None,
        max_ticks: int,
        until_done: bool = False,
        shadow: bool = False,
    ) -> tuple[list[Tick], Robot]:
        """Up to ``max_ticks`` control ticks of the active version on a fresh robot (until the
        robot reports its episode done, with ``until_done``); with ``shadow`` the actions are
        computed but not sent."""
        policy = self.policy(self.slots.slot("active"))
        robot: Robot = self.driver(policy.cameras, policy.image_size)
        if shadow:
            robot = ShadowRobot(robot)
        robot.connect()
        if not instruction:  # the scene's own task, when the driver poses one
            instruction = getattr(robot, "instruction", None) or self.config.instruction
        ticks: list[Tick] = []
        try:
            with target_loop(policy, robot, instruction, self.profile, self.config.pace) as loop:
                while len(ticks) < max_ticks and not (until_done and getattr(robot, "done", False)):
                    ticks += loop.run(1)
        finally:
            robot.stop()
        return ticks, robot

    def health_check(self) -> str:
        """A few control ticks (``health_ticks``, in shadow mode if the config says so): no
        deadline miss, no engine error, no unsafe value refused (:attr:`Tick.refused`: NaN, inf,
        an action outside the robot's limits), else :class:`Refused`; returns the step's
        detail."""
        ticks, _ = self.control(
            self.config.instruction, self.config.health_ticks, shadow=self.config.shadow_health
        )
        misses = sum(t.missed for t in ticks)
        errors = [t.error for t in ticks if t.error]
        refused = [t.refused for t in ticks if t.refused]
        if misses or errors or refused:
            counts = f"{misses} deadline misses, {len(errors)} engine errors"
            counts += f", {len(refused)} unsafe values refused" if refused else ""
            first = f" (first: {(errors + refused)[0]})" if errors or refused else ""
            raise Refused(f"{counts} in {len(ticks)} ticks{first}")
        worst = max(t.latency_s for t in ticks) * 1000.0
        return f"{len(ticks)} ticks, no miss, no error (max {worst:.2f} ms)"

    def episode(self, slot: Slot, instruction: str | None, max_ticks: int) -> EpisodeResult:
        """One episode of the active version (``slot``) until the robot says it is done or
        ``max_ticks``."""
        ticks, robot = self.control(instruction, max_ticks, until_done=True)
        ms = np.array([t.latency_s for t in ticks]) * 1000.0
        success = getattr(robot, "success", None)
        return EpisodeResult(
            version=f"{slot.model_name}:{slot.model_version}",
            success=None if success is None else bool(success),
            ticks=len(ticks),
            p50_ms=float(np.percentile(ms, 50)),
            p99_ms=float(np.percentile(ms, 99)),
            misses=sum(t.missed for t in ticks),
            errors=sum(bool(t.error) for t in ticks),
            reason=str(getattr(robot, "reason", "") or ""),
        )

    def serving(self, slot: Slot) -> Served:
        """The active version (``slot``) as the policy server runs it: opened as the health
        check runs it (:meth:`policy`) the first time a version is asked for, then reused until
        another version is active (the engine is shared by the server's threads: ONNX Runtime's
        ``run`` is thread-safe). The robot's spec is the driver's, for the policy's cameras: a
        driver's robot is not connected (nor the hardware touched) until ``connect()``."""
        with self._serving_lock:
            if self._serving is None or self._serving[0] != slot.path:
                policy = self.policy(slot)
                spec = self.driver(policy.cameras, policy.image_size).spec
                version = f"{slot.model_name}:{slot.model_version}"
                self._serving = (slot.path, Served(policy, version, spec))
            return self._serving[1]
