"""Robot definitions: rp5's spec, and clear errors for bad names, MJCF and limits."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from robots.limits import action_fault
from robots.rp5 import RP5
from robots.sawyer import SAWYER
from robots.spec import (
    ActionKind,
    ActionSpec,
    RobotDefinitionError,
    RobotSpec,
    get_robot,
    load_robot,
)


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
    with pytest.raises(RobotDefinitionError, match=r"robot .ur5.; valid choices: rp5, sawyer"):
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


def test_a_declared_robot_is_registered_like_a_compiled_one() -> None:
    """A registry entry may name a declared ``RobotSpec`` (Meta-World's Sawyer, commanded in
    hand space: 3 deltas of 0.01 m per unit, a gripper effort no state measures; 80 Hz):
    get_robot returns it as is; asking it for an MJCF definition names the robot; a declared
    action on a state component the robot does not have is refused when it is declared."""
    hand = get_robot("sawyer")
    assert hand is SAWYER and hand.control_hz == 80.0 and hand.action.dim == 4
    assert hand.definition is None and hand.arm == ()
    with pytest.raises(RobotDefinitionError, match="robot 'sawyer' is declared without an MJCF"):
        hand.load_model()
    with pytest.raises(
        RobotDefinitionError, match="acts on state component 2, but the state has 2"
    ):
        dataclasses.replace(hand, state_names=("hand.x", "hand.y"))
    with pytest.raises(RobotDefinitionError, match="control_hz must be > 0"):
        dataclasses.replace(hand, control_hz=0.0)
    with pytest.raises(RobotDefinitionError, match="3 state units for 7 state components"):
        dataclasses.replace(hand, state_units=("m", "m", "m"))


def test_units_are_said_per_component_group(rp5: RobotSpec) -> None:
    """What an export's io_spec says of its state and actions: the robot's own units."""
    assert rp5.state_units_text == "rad (base_yaw.pos … wrist_roll.pos), m (gripper.opening)"
    assert rp5.action_units_text == ("rad (base_yaw.delta … wrist_roll.delta), m (gripper.opening)")
    sawyer = get_robot("sawyer")
    assert sawyer.state_units_text == (
        "m (hand.x … hand.z), 1 (gripper.opening), m (goal.x … goal.z)"
    )
    assert sawyer.action_units_text == "cm (hand.dx … hand.dz), 1 (gripper.effort)"


def test_chunk_targets_and_action_toward_follow_each_components_kind(rp5: RobotSpec) -> None:
    """A delta is planned from the measured state in its own scale and clipped to its bounds; an
    effort passes as planned; the action toward a plan re-measures only the deltas."""
    hand = SAWYER
    state = np.array([0.10, -0.20, 0.05, 0.7], dtype=np.float32)
    chunk = np.array([[1.0, 0.0, 3.0, 0.5], [1.0, -1.0, 0.0, 1.0]], dtype=np.float32)
    targets = hand.chunk_targets(chunk, state)
    # x: 10 cm + 1 + 1; y: -20 + 0 - 1; z: 5 + 1 (3 clipped to 1) + 0; effort as given.
    np.testing.assert_allclose(targets[:, :3], [[11, -20, 6], [12, -21, 6]], atol=1e-4)
    np.testing.assert_allclose(targets[:, 3], [0.5, 1.0])
    # The robot moved 1.5 cm in x meanwhile: the second action asks only for what is left.
    moved = state + np.array([0.015, 0.0, 0.0, 0.0], dtype=np.float32)
    np.testing.assert_allclose(hand.action_toward(targets[1], moved), [0.5, -1, 1, 1.0], atol=1e-4)
    # rp5: joint deltas in rad (scale 1), the gripper opening absolute.
    q = np.zeros(6, dtype=np.float32)
    planned = rp5.chunk_targets(np.full((2, 6), 0.05, dtype=np.float32), q)
    np.testing.assert_allclose(planned[:, 0], [0.05, 0.10], atol=1e-6)
    np.testing.assert_allclose(planned[:, 5], [0.05, 0.05], atol=1e-6)


def test_hold_action_keeps_what_no_motion_means_for_each_kind(rp5: RobotSpec) -> None:
    """Deltas hold at 0; an absolute holds its measured value, and where that reading is NaN
    the last command (else home); an effort holds the last command (else its neutral value)."""
    hand = SAWYER
    state = np.array([[0.1, 0.2, 0.3, 0.4], [0.0, 0.0, 0.0, 0.9]], dtype=np.float32)
    np.testing.assert_array_equal(hand.hold_action(state), [[0, 0, 0, -1], [0, 0, 0, -1]])
    last = np.array([[0.3, 0.3, 0.3, 0.8], [1, 1, 1, np.nan]], dtype=np.float32)
    held = hand.hold_action(state, last)
    np.testing.assert_allclose(held, np.array([[0, 0, 0, 0.8], [0, 0, 0, -1]]))
    joints = np.array([0.3, -0.2, 0.1, 0.0, 0.5, 0.04], dtype=np.float32)
    np.testing.assert_allclose(rp5.hold_action(joints), [0, 0, 0, 0, 0, 0.04], atol=1e-7)
    joints[5] = np.nan
    home = rp5.authored.home_gripper
    np.testing.assert_allclose(rp5.hold_action(joints)[5], home, atol=1e-7)
    sent = rp5.hold_action(joints, np.full(6, 0.02, dtype=np.float32))
    np.testing.assert_allclose(sent, [0, 0, 0, 0, 0, 0.02], atol=1e-7)


def test_action_fault_names_the_component_by_its_kind(rp5: RobotSpec) -> None:
    """A delta past its whole travel and an effort past one range either side are refused with
    what they act on; values inside are left to the driver's clip."""
    hand = SAWYER
    assert action_fault(hand, "action", np.array([[50.0, -99.0, 1.5, 2.9]])) == ""
    assert action_fault(hand, "action", np.array([[0.0, 101.0, 0.0, 0.0]])) == (
        "action[0, 1] = 101 cm: beyond hand y's travel of 100 cm"
    )
    assert action_fault(hand, "action", np.array([[0.0, 0.0, 0.0, -3.5]])) == (
        "action[0, 3] = -3.5: a gripper effort outside [-3, 3] (its range -1..1, one travel "
        "either side)"
    )


def test_an_action_spec_needs_a_value_per_component_and_a_state_for_each_delta() -> None:
    """A layout whose fields disagree in length, or an effort given a state component, is a
    definition error, not a wrong action later."""

    def one(kind: ActionKind, state_index: int | None, low: tuple[float, ...] = (-1.0,)) -> None:
        ActionSpec(
            ("a",), low, (1.0,), ("",), (kind,), (state_index,), (1.0,), (2.0,), (0.0,), ("a",)
        )

    with pytest.raises(RobotDefinitionError, match="one value per component"):
        one("delta", 0, low=(-1.0, 0.0))
    with pytest.raises(RobotDefinitionError, match="state_index is needed exactly"):
        one("effort", 0)
    with pytest.raises(RobotDefinitionError, match="state_index is needed exactly"):
        one("delta", None)
