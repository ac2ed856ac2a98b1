"""The digital twin: our simulated arm as a ROS 2 node, so the ROS path runs without hardware.

It plays the arm a :class:`~robots.ros2.config.Ros2RobotConfig` describes, as ros2_control and
camera drivers would: on the wall clock at the robot's control rate, each period it

    applies the newest position targets (``Float64MultiArray`` on ``topics.command``, the
            joints in the command's order) as the simulator's action: the arm joints' deltas
            from where they are (clipped to the spec's step, as a real arm's rate limit),
            the fingers' targets summed to the gripper opening; no target yet: it holds;
    steps  the simulation one control period (MuJoCo by default);
    publishes ``JointState`` (every joint by its ROS name), one ``Image`` per camera (rgb8,
            the policy's size) and, on ``topics.episode``, the episode's JSON status
            (``episode``, ``instruction``, ``done``, ``success``, ``step``, ``seed``).

A JSON ``{"episode": ID, "seed": N}`` on ``topics.reset`` starts the episode of seed N (what
the driver sends at ``connect()``); ``"seed": null`` the twin's next (its first seed, plus one
per episode since: successive episodes play different scenes). A position target applies
until the next one arrives, as a position controller holds its last command: a late or
repeated command moves nothing twice.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from robots.ros2.config import Ros2RobotConfig
from robots.ros2.joints import JointOrder
from robots.ros2.node import (
    RELIABLE,
    SENSORS,
    Float64MultiArray,
    Image,
    JointState,
    SpinningNode,
    String,
    image_message,
    read_json,
)
from robots.spec import RobotSpec
from sim_scenes.sim_robot import simulated


@dataclass
class TwinStatus:
    """What the twin did, for its caller (``robo-pipe twin`` prints it at the end)."""

    episodes: int = 0
    steps: int = 0
    commands: int = 0
    """Command messages received."""
    late_steps: int = 0
    """Periods whose step and publishing took longer than the period itself."""


class Twin:
    """The arm ``config`` describes, simulated on ``task`` (see the module docstring)."""

    def __init__(
        self,
        config: Ros2RobotConfig,
        spec: RobotSpec,
        task: str = "touch-mixed",
        image_size: int = 64,
        node: str = "robo_pipe_twin",
    ) -> None:
        t = config.topics
        if not (t.episode and t.reset):
            raise ValueError("the twin needs topics.episode and topics.reset in its config")
        self.config, self.spec = config, spec
        cameras = tuple(t.cameras)
        self.robot = simulated(cameras, image_size, task)
        self._joints = JointOrder(spec, config.command_order(spec))
        self._node_name = node
        self._target: np.ndarray | None = None
        self._reset_to: tuple[str, int] | None = None
        self._next_seed = 0
        self._episode = ""
        self._lock = threading.Lock()
        self.status = TwinStatus()

    def run(self, stop: threading.Event, seed: int = 0) -> TwinStatus:
        """Serve until ``stop`` is set; the first episode is ``seed``'s."""
        t = self.config.topics
        ros = SpinningNode(self._node_name, self.config.domain_id)
        try:
            node = ros.node
            joints = node.create_publisher(JointState, t.joint_states, SENSORS)
            images = {
                c: node.create_publisher(Image, topic, SENSORS) for c, topic in t.cameras.items()
            }
            episode = node.create_publisher(String, t.episode or "", RELIABLE)
            ros.on(Float64MultiArray, t.command, self._on_command)
            ros.on(String, t.reset or "", self._on_reset)
            self.robot.new_episode(seed)
            self.status.episodes, self._next_seed = 1, seed + 1
            period = 1.0 / self.spec.control_hz
            next_tick = time.monotonic()
            while not stop.is_set():
                self._step()
                stamp = node.get_clock().now().to_msg()
                obs = self.robot.observe()
                joints.publish(self._joint_state(obs.state, stamp))
                for camera, publisher in images.items():
                    publisher.publish(image_message(obs.images[camera], stamp, camera))
                episode.publish(String(data=json.dumps(self._episode_status())))
                next_tick += period
                wait = next_tick - time.monotonic()
                if wait < 0:
                    self.status.late_steps += 1
                    next_tick = time.monotonic()  # no burst of catch-up steps after a stall
                stop.wait(max(0.0, wait))
        finally:
            self.robot.stop()
            ros.close()
        return self.status

    def _on_command(self, message: Float64MultiArray) -> None:
        targets = np.asarray(message.data, dtype=np.float64)
        if targets.shape == (len(self._joints.order),) and np.all(np.isfinite(targets)):
            with self._lock:
                self._target = targets
                self.status.commands += 1

    def _on_reset(self, message: String) -> None:
        request = read_json(message)
        episode, seed = request.get("episode"), request.get("seed")
        if not isinstance(episode, str) or episode == self._episode:
            return
        with self._lock:
            if self._reset_to is not None and self._reset_to[0] == episode:
                return  # the driver asks again until it hears the episode: one reset
            if seed is None:
                seed, self._next_seed = self._next_seed, self._next_seed + 1
            if isinstance(seed, int):
                self._reset_to = (episode, seed)

    def _step(self) -> None:
        """A pending reset, else one control period toward the newest target."""
        with self._lock:
            reset, self._reset_to = self._reset_to, None
            target = self._target
            if reset is not None:
                self._target = None  # the last episode's targets are not this one's
                self._episode = reset[0]  # under the lock: a repeat of it is now ignored
        if reset is not None:
            self.robot.new_episode(reset[1])
            self.status.episodes += 1
            return
        state = self.robot.observe().state
        self.robot.act(self._action_toward(target, state))
        self.status.steps += 1

    def _action_toward(self, target: np.ndarray | None, state: np.ndarray) -> np.ndarray:
        """The simulator's action that moves ``state`` toward the position ``target``."""
        if target is None:
            return self.spec.hold_action(state)
        return self._joints.action(target, self._joints.positions(state))

    def _joint_state(self, state: np.ndarray, stamp: Any) -> JointState:
        """Every joint by its ROS name (:meth:`~robots.ros2.joints.JointOrder.positions`)."""
        message = JointState()
        message.header.stamp = stamp
        message.name = [self.config.joints[j] for j in self._joints.order]
        message.position = [float(p) for p in self._joints.positions(state)]
        return message

    def _episode_status(self) -> dict[str, Any]:
        return {
            "episode": self._episode,
            "instruction": self.robot.instruction,
            "done": self.robot.done,
            "success": self.robot.success,
            "step": self.status.steps,
            "seed": self.robot.seed,
        }
