"""The simulator behind the real-robot interface behaves like a robot at that seam."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

from robots.interface import Robot
from robots.spec import RobotSpec
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import SceneError, get_variant


def test_simulated_robot_observes_acts_and_stops(rp5: RobotSpec) -> None:
    robot: Robot = SimulatedRobot(rp5, get_variant("touch-mixed"), seed=4, image_size=32)
    assert not robot.is_connected
    with pytest.raises(SceneError, match="connect"):
        robot.observe()
    robot.connect()
    first = robot.observe()
    assert first.state.shape == (rp5.state_dim,)
    assert set(first.images) == {"scene", "wrist"}
    assert first.images["wrist"].shape == (32, 32, 3)
    step = np.zeros(rp5.action.dim)
    step[0] = 0.05  # base yaw +0.05 rad
    robot.act(step)
    after = robot.observe()
    assert after.timestamp == pytest.approx(1 / rp5.control_hz)
    assert after.state[0] - first.state[0] == pytest.approx(0.05, abs=0.005)
    with pytest.raises(SceneError, match=r"action must have shape \(6,\)"):
        robot.act(np.zeros(3))
    robot.stop()
    robot.stop()  # idempotent
    assert not robot.is_connected


@pytest.mark.parametrize("variant", ["touch-single", "touch-mixed", "touch-cubes"])
def test_the_local_agent_drives_the_simulated_arm_on_the_task_the_run_learnt(
    variant: str, robo_pipe_home: Path
) -> None:
    """The local edge agent of a run plays the task the run learnt (touch-single: the quick
    start's episode on the agent), with the family's example instruction at its gate."""
    from deploy_edge.agent.config import load_driver
    from pipelines.config import load_config
    from pipelines.deploy.local_agent import write_device_config
    from tests.conftest import TINY_CONFIG

    cfg = load_config(TINY_CONFIG, [f"scene.variant={variant}"])
    device = yaml.safe_load(write_device_config(cfg, 8123).read_text())
    robot = load_driver(device["driver"], device["driver_args"])(("scene",), 32)
    assert isinstance(robot, SimulatedRobot)
    assert robot.variant.name == variant, device
    assert device["instruction"] == "touch the red cube"
