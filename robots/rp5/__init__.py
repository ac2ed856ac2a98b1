"""rp5: robo-pipe's own five-joint tabletop arm with a parallel gripper (``rp5.xml``)."""

from pathlib import Path

from robots.spec import RobotDefinition

RP5 = RobotDefinition(
    name="rp5",
    description="5-DoF tabletop arm (yaw, 3 pitch, roll) with a parallel two-finger gripper",
    mjcf=Path(__file__).with_name("rp5.xml"),
    arm_joints=("base_yaw", "shoulder_pitch", "elbow_pitch", "wrist_pitch", "wrist_roll"),
    gripper_joints=("finger_left", "finger_right"),
    tcp_site="tcp",
    cameras=("scene", "wrist"),
    control_hz=10.0,
    physics_timestep=0.01,
    # Tool pointing down over the workspace centre, elbow up.
    home_arm=(0.0, 0.35, 1.75, 1.05, 0.0),
    home_gripper=0.015,
    max_joint_delta=0.08,
)
