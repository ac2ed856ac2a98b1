"""What the ROS 2 driver needs to know of an arm: its topics, its joint names, its safety ages.

Example (``configs/ros2/rp5-twin.yaml``, the digital twin's; a real arm changes the topics and
the joint names)::

    robot: rp5
    joints:                       # the robot spec's joint -> the arm's ROS joint name
      base_yaw: joint1
      shoulder_pitch: joint2
      ...
    topics:
      joint_states: /joint_states                        # sensor_msgs/JointState, in
      command: /forward_position_controller/commands     # std_msgs/Float64MultiArray, out
      cameras: {scene: /scene_camera/image_raw, wrist: /wrist_camera/image_raw}  # sensor_msgs/Image
      estop: /robo_pipe/estop                            # std_msgs/Bool, in
    max_age_s: 0.25
    lost_after_s: 1.0

Nothing here imports ROS: a config is checked (and a mistake named) where rclpy is not installed.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from robo_pipe.errors import InputError
from robo_pipe.validation import first_error, read_mapping
from robots.ros2.joints import check_names
from robots.spec import RobotDefinitionError, RobotSpec, get_robot


class Ros2ConfigError(InputError):
    """A ROS 2 robot config that cannot drive its robot (the message names file and field)."""


class Ros2Topics(BaseModel):
    """The arm's topics (names as ``ros2 topic list`` shows them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    joint_states: str = "/joint_states"
    """``sensor_msgs/JointState`` in: positions in rad (revolute) and m (prismatic), by joint
    name (ros2_control's joint_state_broadcaster publishes it)."""
    command: str = "/forward_position_controller/commands"
    """``std_msgs/Float64MultiArray`` out: one position target per joint of
    :attr:`Ros2RobotConfig.command_joints`, in that order (ros2_control's
    ``forward_command_controller`` on the position interface)."""
    cameras: dict[str, str] = Field(min_length=1)
    """The spec's camera name -> its ``sensor_msgs/Image`` topic (``rgb8``, ``bgr8`` or
    ``rgba8``; any size: the driver crops the centre square and resizes it to the policy's)."""
    estop: str = "/robo_pipe/estop"
    """``std_msgs/Bool`` in: ``true`` stops the arm holding its position until the episode ends."""
    episode: str | None = None
    """``std_msgs/String`` in, JSON ``{"episode", "instruction", "done", "success"}``: what a
    simulator (the twin) says of its episode; a real arm has none (success is then unknown)."""
    reset: str | None = None
    """``std_msgs/String`` out, JSON ``{"episode", "seed"}``: asks a simulator for a new episode
    at ``connect()``; a real arm has none (it starts where it is)."""


class Ros2RobotConfig(BaseModel):
    """An arm on ROS 2 behind :class:`robots.interface.Robot` (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    robot: str = "rp5"
    """The robot spec (``robo-pipe robots`` lists them): limits, control rate, cameras. It
    must be one authored from MJCF (with joints)."""
    node: str = "robo_pipe_driver"
    """The driver's ROS node name."""
    joints: dict[str, str] = Field(min_length=1)
    """Every joint of the spec (arm and gripper) -> the arm's ROS joint name."""
    command_joints: list[str] | None = None
    """The spec's joints in the order the position controller lists its ``joints``; default:
    the spec's order (arm, then gripper)."""
    topics: Ros2Topics
    max_age_s: float = Field(default=0.25, gt=0)
    """An observation whose joint state or any image arrived longer ago than this is stale: the
    tick holds the arm where it is and counts as a miss. Default: two and a half periods of a
    10 Hz loop (a late camera frame or two is tolerated, a stalled publisher is not)."""
    lost_after_s: float = Field(default=1.0, gt=0)
    """Stale this long: the publisher is lost and the episode ends (a failure, with the reason)."""
    connect_timeout_s: float = Field(default=10.0, gt=0)
    """``connect()`` waits this long for the first joint state and every camera's first image."""
    domain_id: int | None = Field(default=None, ge=0, le=232)
    """``ROS_DOMAIN_ID`` (None: the environment's, else 0)."""

    @model_validator(mode="after")
    def _ages(self) -> Ros2RobotConfig:
        if self.lost_after_s < self.max_age_s:
            raise ValueError(
                f"field 'lost_after_s' = {self.lost_after_s}: must be >= max_age_s "
                f"({self.max_age_s})"
            )
        return self

    def check_against(self, spec: RobotSpec) -> None:
        """ValueError naming the field when this config cannot drive ``spec``'s robot."""
        fields = ("joints", "command_joints", "topics.cameras")
        check_names(spec, self.joints, self.command_joints, self.topics.cameras, fields)

    def command_order(self, spec: RobotSpec) -> list[str]:
        """The spec's joint names in the command's order."""
        return self.command_joints or [j.name for j in (*spec.arm, *spec.gripper)]


def load_ros2_config(path: str | Path) -> tuple[Ros2RobotConfig, RobotSpec]:
    """The config in ``path`` and the robot spec it drives, checked against each other;
    :class:`Ros2ConfigError` naming the file, field and value otherwise."""
    file = Path(path)
    data = read_mapping(file, "ROS 2 robot config", Ros2ConfigError)
    try:
        config = Ros2RobotConfig.model_validate(data)
    except ValidationError as err:
        raise Ros2ConfigError(first_error(file, err)) from err
    try:
        spec = get_robot(config.robot)
    except (RobotDefinitionError, KeyError, ValueError) as err:
        raise Ros2ConfigError(f"{file}: field 'robot' = {config.robot!r}: {err}") from err
    if not spec.arm:
        raise Ros2ConfigError(
            f"{file}: field 'robot' = {config.robot!r}: declared without joints (no MJCF); "
            "the ROS 2 driver maps joints by name"
        )
    try:
        config.check_against(spec)
    except ValueError as err:
        raise Ros2ConfigError(f"{file}: {err}") from err
    return config, spec
