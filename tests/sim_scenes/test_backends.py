"""The backend registry: every backend is chosen by name there, the config accepts exactly its
names, and the simulated robot runs on whichever backend ``sim`` names."""

from __future__ import annotations

from pathlib import Path

import mujoco
import pytest

from robots.spec import RobotSpec
from sim_scenes.backends import backend_class, check_backend, simulator_version
from sim_scenes.batched_env import BatchedEnv
from sim_scenes.config import BACKENDS, SimConfig
from sim_scenes.isaaclab.env import ENV_VAR, IsaacLabMissingError
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import SceneError, get_variant


@pytest.mark.parametrize("name", sorted(BACKENDS))
def test_every_registered_backend_is_a_batched_env(name: str) -> None:
    assert issubclass(backend_class(name), BatchedEnv)
    assert SimConfig(backend=name).backend == name


def test_an_unknown_backend_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown simulator backend; valid choices: mujoco, "):
        SimConfig(backend="bullet")
    with pytest.raises(SceneError, match="unknown simulator backend 'bullet'; valid choices"):
        backend_class("bullet")


def test_mujoco_is_the_default_and_says_its_version() -> None:
    assert backend_class(SimConfig().backend) is MujocoBatchedEnv
    assert simulator_version(SimConfig()) == f"mujoco=={mujoco.__version__}"
    check_backend(SimConfig())


def test_the_simulated_robot_runs_on_the_backend_sim_names(
    rp5: RobotSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "no-python"))
    isaaclab = SimConfig(backend="isaaclab")
    with pytest.raises(IsaacLabMissingError):
        check_backend(isaaclab)
    robot = SimulatedRobot(rp5, get_variant("touch-mixed"), sim=isaaclab)
    with pytest.raises(IsaacLabMissingError):  # it went to Isaac Lab, whose Python is missing
        robot.connect()
    assert not robot.is_connected
