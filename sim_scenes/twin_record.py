"""The twin driven by the scripted expert, recorded to a rosbag (``robo-pipe twin --expert
--record BAG``): what a lab records while an operator teleoperates its arm, made here.

Simulated time, as fast as the simulator runs (no ROS peer is needed, nor rclpy): each control
period of ``1 / control_hz`` s at time ``t`` writes, as a ros2_control arm with two cameras
would publish them,

    /joint_states                 at ``t - 2 ms``   measured just before the frame
    each camera's image           at ``t``
    the episode's status (JSON)   at ``t``
    the position command          at ``t + 5 ms``   the controller's answer to that frame
    the named object's position   at ``t``          (``/robo_pipe/target``: the scene's ground
                                                     truth, as a lab's motion capture tracks it)

and episodes are separated by a 2 s pause (a reset). Topic and joint names are the ROS 2 robot
config's, so the bag imports with the matching mapping (``configs/ros2/rp5-twin-bag.yaml``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robots.ros2.bags import BagWriter
from robots.ros2.config import Ros2RobotConfig
from robots.ros2.joints import JointOrder
from robots.spec import RobotSpec
from sim_scenes.sim_robot import simulated
from sim_scenes.tasks import resolve_task

START_NS = 1_767_225_600 * 1_000_000_000
"""The recording's first frame: 2026-01-01 00:00 UTC (a fixed clock: the same seeds make the
same bag)."""
STATE_LEAD_NS = 2_000_000
COMMAND_LAG_NS = 5_000_000
PAUSE_NS = 2_000_000_000
TRUTH_TOPIC = "/robo_pipe/target"
"""``geometry_msgs/PointStamped``: the named object's centre (touch's ground truth), at ``t``."""


@dataclass
class Recording:
    """What was recorded."""

    episodes: int = 0
    solved: int = 0
    frames: int = 0
    bytes: int = 0
    """Serialized message bytes (before compression)."""


def record_expert(
    config: Ros2RobotConfig,
    spec: RobotSpec,
    task: str,
    episodes: int,
    seed: int,
    bag: Path,
    image_size: int = 64,
    storage: str = "mcap",
    on_episode: Callable[[Recording], None] | None = None,
) -> Recording:
    """``episodes`` expert episodes of ``task`` (seeds ``seed``, ``seed + 1``, ...) into the new
    bag ``bag`` (see the module docstring)."""
    t = config.topics
    family, _ = resolve_task(task)
    robot = simulated(tuple(t.cameras), image_size, task)
    expert = family.expert(spec)
    joints = JointOrder(spec, config.command_order(spec))
    names = [config.joints[j] for j in joints.order]
    period = int(1e9 / spec.control_hz)
    now, done = START_NS, Recording()
    with BagWriter(bag, storage=storage) as writer:
        for k in range(episodes):
            robot.new_episode(seed + k)
            episode = f"expert-{seed + k}"
            while True:
                obs = robot.observe()
                positions = joints.positions(obs.state)
                writer.joint_state(t.joint_states, now - STATE_LEAD_NS, names, positions)
                for camera, topic in t.cameras.items():
                    writer.image(topic, now, obs.images[camera], camera)
                status = {
                    "episode": episode,
                    "instruction": robot.instruction,
                    "done": robot.done,
                    "success": robot.success,
                }
                writer.string(t.episode or "/robo_pipe/episode", now, json.dumps(status))
                if family.env_state_names:  # the scene's ground truth, as mocap would track it
                    writer.point(TRUTH_TOPIC, now, robot.env_state(family))
                done.frames += 1
                if robot.done:
                    break
                action = np.clip(robot.expert_action(expert), spec.action.low, spec.action.high)
                writer.command(t.command, now + COMMAND_LAG_NS, joints.targets(action, positions))
                robot.act(action)
                now += period
            done.episodes += 1
            done.solved += int(robot.success)
            done.bytes = writer.bytes
            if on_episode is not None:
                on_episode(done)
            now += PAUSE_NS
    robot.stop()
    return done
