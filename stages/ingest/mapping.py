"""How a rosbag's topics become a dataset's features: ``robo-pipe import rosbag``'s mapping file.

Example (the twin's bags: ``configs/ros2/rp5-twin-bag.yaml``)::

    robot: rp5
    reference: /scene_camera/image_raw     # one frame per message of this topic
    every: 1                               # ... or per k-th (a 30 Hz camera, a 10 Hz robot: 3)
    max_age_s: 0.1                         # a feature older than this at a frame's time: dropped
    state:
      topic: /joint_states                 # sensor_msgs/JointState
      joints: {base_yaw: rp5_base_yaw_joint, ...}   # every joint of the robot -> its ROS name
    cameras: {scene: /scene_camera/image_raw, wrist: /wrist_camera/image_raw}
    image_size: 64                         # px: the centre square, resized (never enlarged)
    action:
      source: command                      # or next_state
      topic: /forward_position_controller/commands   # std_msgs/Float64MultiArray (command)
      joints: [base_yaw, ...]              # the command's order (default: the robot's)
    extras:                                # more float features, as observation.<name>
      imu: {topic: /imu, fields: [linear_acceleration, angular_velocity]}
    env_state: {topic: /robo_pipe/target, fields: [point]}   # ground truth (mocap), optional
    episodes:
      topic: /robo_pipe/episode            # std_msgs/String JSON: a new "episode" id starts one
      gap_s: 1.0                           # ... and a gap this long in the reference always does
    task: touch the red cube               # the instruction (default: the episode topic's)

Time is each message's ``header.stamp`` where it has one (when the sensor measured it), else
when the bag logged it. Nothing here opens the bag: the importer checks the mapping against it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from robo_pipe.errors import InputError
from robo_pipe.validation import first_error, read_mapping
from robots.ros2.joints import check_names
from robots.spec import RobotDefinitionError, RobotSpec, get_robot


class MappingError(InputError):
    """A mapping file that cannot describe the bag or the robot (file, field, value named)."""


class StateMap(BaseModel):
    """The robot's proprioception: joint positions by ROS name."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str = "/joint_states"
    joints: dict[str, str] = Field(min_length=1)
    """Every joint of the robot spec (arm and gripper) -> its name in the JointState."""


class ActionMap(BaseModel):
    """Where the action of each frame comes from.

    ``command``: the newest position command at or before the frame's time (what the operator
    or controller asked for), as the robot's action relative to the frame's measured state;
    ``next_state``: the next frame's measured state (what happened), for bags with no command
    topic; an episode's last frame then has no action and is dropped."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    source: Literal["command", "next_state"] = "command"
    topic: str | None = None
    """``std_msgs/Float64MultiArray`` of position targets (``source: command``)."""
    joints: list[str] | None = None
    """The robot's joints in the command's order (default: the robot's order)."""

    @model_validator(mode="after")
    def _topic(self) -> ActionMap:
        if self.source == "command" and not self.topic:
            raise ValueError("field 'action.topic': source 'command' needs the command topic")
        return self


class ExtraMap(BaseModel):
    """More float features of a message, sampled as the state is (an IMU's readings)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str
    fields: list[str] = Field(min_length=1)
    """Message fields, dotted (``linear_acceleration``: a vector's x, y, z; ``data``: a number
    or an array)."""


class EpisodeRule(BaseModel):
    """Where one episode ends and the next begins."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    topic: str | None = None
    """``std_msgs/String`` JSON with an ``episode`` id (and ``instruction``, ``success``): a new
    id starts an episode."""
    gap_s: float = Field(default=1.0, gt=0)
    """A gap this long between reference messages starts an episode too."""


class RosbagMapping(BaseModel):
    """A bag's topics -> a LeRobot v3 dataset's features (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    robot: str = "rp5"
    reference: str
    every: int = Field(default=1, ge=1)
    max_age_s: float = Field(default=0.1, gt=0)
    state: StateMap
    cameras: dict[str, str] = Field(min_length=1)
    image_size: int = Field(default=64, ge=16, le=512)
    video_crf: int = Field(default=0, ge=0, le=51)
    """The dataset's videos' quality (x264 CRF; 0: lossless, as collect's default: the frames
    trained on are the frames imported, byte for byte). Measured on the twin's bag: 23 gave the
    same held-out success as 0 (51.5% vs 52.5%, 200 episodes), at a quarter of the size."""
    action: ActionMap
    extras: dict[str, ExtraMap] = Field(default_factory=dict)
    env_state: ExtraMap | None = None
    """Ground truth of the scene (a tracked object's position), sampled as the state is and
    written as ``observation.environment_state``: fine-tuning's auxiliary target (the named
    object's x, y first), never a policy input. A real arm's bag has it only with motion
    capture; without it the policy trains without that target."""
    env_state_names: list[str] = Field(default_factory=lambda: ["target.x", "target.y", "target.z"])
    episodes: EpisodeRule = Field(default_factory=EpisodeRule)
    task: str | None = None
    rate_tolerance: float = Field(default=0.1, gt=0, lt=1)
    """The frames' rate (the reference's over ``every``) may differ from the robot's control
    rate by this fraction; more is refused (a policy trained on it would run at another rate)."""

    @model_validator(mode="after")
    def _instruction(self) -> RosbagMapping:
        if self.task is None and self.episodes.topic is None:
            raise ValueError("give 'task' (the instruction) or 'episodes.topic' (which has one)")
        return self

    def topics(self) -> dict[str, str]:
        """Every topic the mapping reads -> what it is for (for errors and the report)."""
        roles: list[tuple[str, str]] = [(self.state.topic, "state")]
        roles += [(topic, f"camera {name}") for name, topic in self.cameras.items()]
        roles += [(self.action.topic, "action")] if self.action.topic else []
        roles += [(extra.topic, f"extra {name}") for name, extra in self.extras.items()]
        roles += [(self.env_state.topic, "env_state")] if self.env_state else []
        roles += [(self.episodes.topic, "episodes")] if self.episodes.topic else []
        found: dict[str, str] = {}
        for topic, role in roles:
            found[topic] = f"{found[topic]}, {role}" if topic in found else role
        if self.reference not in found:
            return {self.reference: "reference", **found}
        return {t: f"reference, {r}" if t == self.reference else r for t, r in found.items()}

    def check_against(self, spec: RobotSpec) -> None:
        """ValueError naming the field when this mapping cannot describe ``spec``'s robot."""
        fields = ("state.joints", "action.joints", "cameras")
        check_names(spec, self.state.joints, self.action.joints, self.cameras, fields)

    def command_order(self, spec: RobotSpec) -> list[str]:
        """The robot's joint names in the command's order."""
        return self.action.joints or [j.name for j in (*spec.arm, *spec.gripper)]


def load_mapping(path: str | Path) -> tuple[RosbagMapping, RobotSpec]:
    """The mapping in ``path`` and its robot, checked against each other; :class:`MappingError`
    naming the file, field and value otherwise."""
    file = Path(path)
    data = read_mapping(file, "rosbag mapping file", MappingError)
    try:
        mapping = RosbagMapping.model_validate(data)
    except ValidationError as err:
        raise MappingError(first_error(file, err)) from err
    try:
        spec = get_robot(mapping.robot)
    except RobotDefinitionError as err:
        raise MappingError(f"{file}: field 'robot' = {mapping.robot!r}: {err}") from err
    if not spec.arm:
        raise MappingError(
            f"{file}: field 'robot' = {mapping.robot!r}: declared without joints (no MJCF); "
            "a bag's joint states map to an MJCF robot's joints"
        )
    try:
        mapping.check_against(spec)
    except ValueError as err:
        raise MappingError(f"{file}: {err}") from err
    return mapping, spec
