"""An arm on ROS 2 behind :class:`robots.interface.Robot`: joint states and camera images in,
joint position targets out, with the safety rules a driver must keep.

Commands: one ``std_msgs/Float64MultiArray`` of position targets per control tick, the joints
in the position controller's order, to ros2_control's ``forward_command_controller`` on the
position interface. Why that and not a ``JointTrajectory`` controller: the policy already
streams one target per period at the control rate; a trajectory controller would add its own
interpolation and timing on top of the policy's and take a goal per tick through a heavier
interface. A policy's action (rp5: joint position deltas, gripper opening) becomes targets as
the simulator applies it: ``measured + clip(delta, ±max_joint_delta)`` per arm joint, clipped to
the joint's travel; the opening shared equally between the fingers.

Safety:
    limits      every action is clipped to the spec's action bounds and every target to the
                joint's limits; a non-finite action holds;
    stale       an observation whose joint state or any image arrived more than ``max_age_s``
                ago carries :attr:`RobotObservation.fault`: the control loops send the hold
                action (no motion) and count the tick as a miss;
    lost        stale for ``lost_after_s``: the episode ends (:attr:`done`, not a success,
                :attr:`reason` says why), and the arm holds;
    e-stop      ``true`` on the e-stop topic: from then on only holds are sent, the episode
                ends;
    hold        is the last *measured* position of every joint, sent as a target, never a
                target computed from a stale measurement plus a delta.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.errors import RoboPipeError
from robots.interface import Robot, RobotObservation
from robots.ros2.config import Ros2RobotConfig, load_ros2_config
from robots.ros2.joints import JointOrder
from robots.ros2.node import (
    RELIABLE,
    Bool,
    Float64MultiArray,
    Image,
    JointState,
    SpinningNode,
    String,
    image_array,
    read_json,
)
from robots.spec import RobotSpec


class Ros2ConnectError(RoboPipeError, RuntimeError):
    """``connect()`` did not hear the arm (a topic with no publisher, no twin answering), or
    what it heard does not fit the config (a joint it names missing, an image it cannot read)."""


class Ros2Robot(Robot):
    """The arm ``config`` describes, for a policy with ``cameras`` at ``image_size`` px.

    Nothing touches ROS until :meth:`connect` (the agent builds a robot to read its spec).
    Besides the interface: :attr:`done`, :attr:`success` (None on a real arm: only a simulator
    says), :attr:`reason` and :attr:`instruction` (the simulator's task, if it poses one)."""

    def __init__(
        self,
        config: Ros2RobotConfig,
        spec: RobotSpec,
        cameras: tuple[str, ...],
        image_size: int,
        seed: int | None = None,
    ) -> None:
        missing = [c for c in cameras if c not in config.topics.cameras]
        if missing:
            raise ValueError(
                f"the policy takes camera(s) {', '.join(missing)}, the ROS 2 config has topics "
                f"for {', '.join(config.topics.cameras)}"
            )
        self.spec, self.config = spec, config
        self._cameras, self._image_size, self._seed = tuple(cameras), image_size, seed
        self._joints = JointOrder(spec, config.command_order(spec))
        self._ros: SpinningNode | None = None
        self._t0 = 0.0
        self._stale = False  # the last observation was stale: act() holds
        self._command: Any = None  # the command publisher, once connected
        self._reset: Any = None
        self._held: np.ndarray | None = None  # the last measured joint positions (command order)
        self._episode: dict[str, object] = {}
        self._episode_id = ""
        self._estop = threading.Event()
        self.done = False
        self.success: bool | None = None
        self.reason = ""
        """Why the episode ended on the driver's side ("" while it runs, or when the simulator
        ended it)."""
        self.instruction: str | None = None

    @property
    def is_connected(self) -> bool:
        return self._ros is not None

    @property
    def simulator_episode(self) -> dict[str, object]:
        """A simulator's status of this episode as ``connect()`` heard it (the twin's
        ``episode``, ``instruction``, ``seed``...); {} for a real arm."""
        return dict(self._episode)

    # -- lifecycle -------------------------------------------------------------------------------

    def connect(self) -> None:
        """Open the node, ask a simulator for a new episode (when the config names a reset topic),
        and wait for the first joint state and every camera's first image."""
        t = self.config.topics
        if self._ros is None:
            self._ros = SpinningNode(self.config.node, self.config.domain_id)
            self._ros.keep_latest(JointState, t.joint_states)
            for camera in self._cameras:
                self._ros.keep_latest(Image, t.cameras[camera])
            if t.episode:
                self._ros.keep_latest(String, t.episode, RELIABLE)
            self._ros.on(Bool, t.estop, self._on_estop)
            self._command = self._ros.node.create_publisher(Float64MultiArray, t.command, RELIABLE)
            self._reset = (
                self._ros.node.create_publisher(String, t.reset, RELIABLE) if t.reset else None
            )
        self._ros.forget()
        self._estop.clear()
        self.done, self.reason, self._stale = False, "", False
        self.success = False if t.episode else None  # only a simulator says
        self._episode_id = f"{self.config.node}-{time.monotonic_ns()}"
        self._t0 = time.monotonic()
        deadline = self._t0 + self.config.connect_timeout_s
        while (waiting := self._waiting_for()) and time.monotonic() < deadline:
            if self._reset is not None:  # again until heard: the subscriber may match late
                request = {"episode": self._episode_id, "seed": self._seed}
                self._reset.publish(String(data=json.dumps(request)))
            time.sleep(0.05)
        if waiting:
            self.stop()
            raise Ros2ConnectError(
                f"ROS 2 robot {self.spec.name}: nothing on {', '.join(waiting)} within "
                f"{self.config.connect_timeout_s:g} s (is the arm's driver, or `robo-pipe twin`, "
                "running on this ROS_DOMAIN_ID?)"
            )
        self._check_first_messages()
        if t.episode:
            self.instruction = str(self._episode.get("instruction") or "") or None

    def _check_first_messages(self) -> None:
        """The first joint state names every mapped joint, every image decodes."""
        assert self._ros is not None
        t = self.config.topics
        try:
            joints = self._ros.latest(t.joint_states)
            assert joints is not None
            self._positions(joints.message)
            for camera in self._cameras:
                image = self._ros.latest(t.cameras[camera])
                assert image is not None
                image_array(image.message, self._image_size)
        except ValueError as err:
            self.stop()
            raise Ros2ConnectError(f"ROS 2 robot {self.spec.name}: {err}") from err

    def _waiting_for(self) -> list[str]:
        """The topics connect() still waits on: each sensor, and a simulator's new episode."""
        assert self._ros is not None
        t = self.config.topics
        topics = [t.joint_states, *(t.cameras[c] for c in self._cameras)]
        waiting = [topic for topic in topics if self._fresh(topic) is None]
        if t.episode:
            got = self._ros.latest(t.episode)
            self._episode = read_json(got.message) if got else {}
            if self._reset is not None and self._episode.get("episode") != self._episode_id:
                waiting.append(f"{t.episode} (a new episode)")
        return waiting

    def _fresh(self, topic: str) -> float | None:
        """When ``topic``'s newest message arrived, on this episode (None: nothing yet)."""
        assert self._ros is not None
        got = self._ros.latest(topic)
        return got.at if got is not None else None

    def _on_estop(self, message: Bool) -> None:
        if message.data:
            self._estop.set()

    def stop(self) -> None:
        """Send the hold (the last measured position), then close the node (idempotent)."""
        if self._ros is None:
            return
        if self._held is not None:
            self._publish(self._held)
        self._ros.close()
        self._ros = None

    # -- the control loop's calls ----------------------------------------------------------------

    def observe(self) -> RobotObservation:
        """The newest joint state and images; :attr:`RobotObservation.fault` when any is older
        than ``max_age_s`` (or the e-stop is on), and the episode's end when it stays so."""
        ros = self._ros
        if ros is None:
            raise Ros2ConnectError("ROS 2 robot: call connect() first")
        t, now = self.config.topics, time.monotonic()
        joints = ros.latest(t.joint_states)
        images = {c: ros.latest(t.cameras[c]) for c in self._cameras}
        fresh = {c: got for c, got in images.items() if got is not None}
        assert joints is not None and len(fresh) == len(images)  # connect() waited for them
        positions = self._positions(joints.message)
        state = self._joints.state(positions)
        ages = {t.joint_states: now - joints.at}
        ages |= {t.cameras[c]: now - got.at for c, got in fresh.items()}
        oldest = max(ages, key=lambda topic: ages[topic])
        fault = ""
        if self._estop.is_set():
            fault = f"e-stop ({t.estop})"
            self._end(f"stopped by the e-stop on {t.estop}")
        elif ages[oldest] > self.config.max_age_s:
            fault = (
                f"stale: {oldest} {ages[oldest]:.2f} s old > max_age_s {self.config.max_age_s:g}"
            )
            if ages[oldest] >= self.config.lost_after_s:
                self._end(
                    f"lost {oldest}: nothing for {ages[oldest]:.2f} s (lost_after_s "
                    f"{self.config.lost_after_s:g}); the arm holds its last measured position"
                )
        else:
            self._held = positions
        self._stale = bool(fault)
        if t.episode and not self.done:
            self._read_episode()
        return RobotObservation(
            images={
                c: image_array(got.message, self._image_size) for c, got in images.items() if got
            },
            state=state,
            timestamp=joints.at - self._t0,
            fault=fault,
        )

    def _read_episode(self) -> None:
        assert self._ros is not None
        got = self._ros.latest(self.config.topics.episode or "")
        status = read_json(got.message) if got else {}
        if status.get("episode") == self._episode_id:
            self.done, self.success = bool(status.get("done")), bool(status.get("success"))

    def _end(self, reason: str) -> None:
        if not self.done:
            self.done, self.success, self.reason = True, False, reason

    def act(self, action: np.ndarray) -> None:
        """Targets from ``action`` (clipped to the action bounds) and the last measured position,
        clipped to the joints' limits; the hold instead once the episode ended, under the e-stop
        or for a non-finite action."""
        if self._ros is None:
            raise Ros2ConnectError("ROS 2 robot: call connect() first")
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (self.spec.action.dim,):
            raise ValueError(
                f"action must have shape ({self.spec.action.dim},), got {action.shape}"
            )
        if self._held is None:
            return  # no fresh measurement yet: nothing safe to command relative to
        if self.done or self._estop.is_set() or self._stale:
            self._publish(self._held)
            return
        if not np.all(np.isfinite(action)):
            self._publish(self._held)
            return
        targets = self._joints.targets(action, self._held)
        self._publish(np.clip(targets, self._joints.low, self._joints.high))

    def _publish(self, targets: np.ndarray) -> None:
        self._command.publish(Float64MultiArray(data=[float(v) for v in targets]))

    # -- conversions -----------------------------------------------------------------------------

    def _positions(self, message: JointState) -> np.ndarray:
        """The spec's joints' positions, command order, from a JointState (by ROS name)."""
        by_name = dict(zip(message.name, message.position, strict=False))
        ros_names = [self.config.joints[n] for n in self._joints.order]
        missing = [n for n in ros_names if n not in by_name]
        if missing:
            raise ValueError(f"{self.config.topics.joint_states} has no joint {', '.join(missing)}")
        return np.array([by_name[n] for n in ros_names], dtype=np.float64)


def ros2_robot(
    cameras: tuple[str, ...], image_size: int, config: str, seed: int | None = None
) -> Ros2Robot:
    """The edge agent's ROS 2 driver (``driver: robots.ros2.driver:ros2_robot``, ``driver_args:
    {config: PATH}``, and ``seed``: a simulator's episode, where each should play the same one;
    by default the twin plays its next): the arm the config file
    describes. :class:`~robots.ros2.config.Ros2ConfigError` names a bad file or field."""
    settings, spec = load_ros2_config(Path(config))
    return Ros2Robot(settings, spec, tuple(cameras), image_size, seed)
