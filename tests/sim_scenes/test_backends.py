"""The backend registry: every backend is chosen by name there, the config accepts exactly its
names, and the simulated robot runs on whichever backend ``sim`` names."""

from __future__ import annotations

from pathlib import Path

import mujoco
import pytest

from robots.spec import RobotSpec
from sim_scenes.backends import backend_class, check_backend, make_env, simulator_version
from sim_scenes.batched_env import BatchedEnv
from sim_scenes.config import BACKENDS, SceneConfig, SimConfig
from sim_scenes.isaaclab.env import ENV_VAR, IsaacLabMissingError
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import SceneError, get_variant, sample_layout, touch_variant


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


def test_the_phrasing_reaches_the_backends_episodes(rp5: RobotSpec) -> None:
    """``make_env(phrasing="unseen")``: the same scenes (state) as the trained phrasing, each
    instruction the one :func:`sample_layout` words for the seed; an unknown phrasing is
    refused when the env is made."""
    seeds, scene, sim = [3, 4], SceneConfig(), SimConfig(num_envs=2)
    with make_env(rp5, scene, sim, cameras=(), autoreset=False) as env:
        trained = env.reset(seeds)
    with make_env(rp5, scene, sim, cameras=(), autoreset=False, phrasing="unseen") as env:
        unseen = env.reset(seeds)
    task = touch_variant(scene.task())
    assert unseen.instruction == [
        sample_layout(task, rp5, s, phrasing="unseen").instruction for s in seeds
    ]
    assert unseen.instruction != trained.instruction
    assert (unseen.state == trained.state).all()
    with pytest.raises(SceneError, match="unknown phrasing 'novel'; valid choices"):
        make_env(rp5, scene, sim, cameras=(), phrasing="novel")  # type: ignore[arg-type]
