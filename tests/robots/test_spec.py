"""Robot definitions: rp5's spec, and clear errors for bad names, MJCF and limits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from robots.rp5 import RP5
from robots.spec import RobotDefinitionError, RobotSpec, get_robot, load_robot


def test_rp5_has_five_arm_joints_a_gripper_two_cameras_and_limits(rp5: RobotSpec) -> None:
    assert len(rp5.arm) >= 5
    assert len(rp5.gripper) == 2
    assert {c.name for c in rp5.cameras} == {"scene", "wrist"}
    assert all(j.low < j.high for j in rp5.arm + rp5.gripper)
    assert rp5.control_hz == 10.0
    assert rp5.substeps == 10


def test_action_spec_documents_units_and_bounds(rp5: RobotSpec) -> None:
    assert rp5.action.dim == len(rp5.arm) + 1
    assert rp5.action.units == ("rad",) * len(rp5.arm) + ("m",)
    assert rp5.action.low[-1] == 0.0
    assert rp5.action.high[-1] == pytest.approx(rp5.max_gripper_opening)
    assert rp5.state_dim == len(rp5.arm) + 1


def test_unknown_robot_lists_valid_choices() -> None:
    with pytest.raises(RobotDefinitionError, match=r"unknown robot 'ur5'; valid choices: rp5"):
        get_robot("ur5")


def _variant_mjcf(tmp_path: Path, old: str, new: str) -> Path:
    text = RP5.mjcf.read_text()
    assert old in text
    path = tmp_path / "arm.xml"
    path.write_text(text.replace(old, new))
    return path


def test_malformed_mjcf_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "broken.xml"
    bad.write_text("<mujoco><worldbody><body></worldbody></mujoco>")
    with pytest.raises(RobotDefinitionError, match=r"broken\.xml: malformed MJCF"):
        load_robot(dataclasses.replace(RP5, mjcf=bad))


def test_missing_mjcf_file(tmp_path: Path) -> None:
    with pytest.raises(RobotDefinitionError, match="MJCF file not found"):
        load_robot(dataclasses.replace(RP5, mjcf=tmp_path / "nope.xml"))


def test_inverted_joint_limits_are_rejected(tmp_path: Path) -> None:
    path = _variant_mjcf(tmp_path, 'range="-0.2 2.7"', 'range="2.7 -0.2"')
    with pytest.raises(RobotDefinitionError, match=r"(?s)arm\.xml.*range.*elbow_pitch"):
        load_robot(dataclasses.replace(RP5, mjcf=path))


def test_unlimited_joint_is_rejected(tmp_path: Path) -> None:
    path = _variant_mjcf(
        tmp_path,
        '<joint name="wrist_roll" axis="0 0 1" range="-3.0 3.0"/>',
        '<joint name="wrist_roll" axis="0 0 1" limited="false"/>',
    )
    with pytest.raises(RobotDefinitionError, match=r"joint 'wrist_roll' has no finite limits"):
        load_robot(dataclasses.replace(RP5, mjcf=path))


def test_actuator_range_outside_joint_range_is_rejected(tmp_path: Path) -> None:
    path = _variant_mjcf(tmp_path, 'ctrlrange="-2.0 2.0"', 'ctrlrange="-2.5 2.5"')
    with pytest.raises(RobotDefinitionError, match=r"actuator 'wrist_pitch' ctrlrange"):
        load_robot(dataclasses.replace(RP5, mjcf=path))


def test_missing_camera_and_bad_home_pose_are_rejected() -> None:
    with pytest.raises(RobotDefinitionError, match=r"camera 'top' not found"):
        load_robot(dataclasses.replace(RP5, cameras=("scene", "top")))
    with pytest.raises(RobotDefinitionError, match=r"home position 3\.0 of joint 'elbow_pitch'"):
        load_robot(dataclasses.replace(RP5, home_arm=(0.0, 0.0, 3.0, 0.0, 0.0)))


def test_control_rate_must_divide_into_physics_steps() -> None:
    with pytest.raises(RobotDefinitionError, match="not a whole number"):
        load_robot(dataclasses.replace(RP5, control_hz=7.0))
