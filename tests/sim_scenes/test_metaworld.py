"""Meta-World through its worker process: the scripted experts solve their tasks, camera images
have the asked size, move with the robot and repeat with the seed, and a missing environment, an
unknown task or camera, or a dead worker each get a clear error.

Tests marked ``metaworld`` need the Meta-World environment (``make metaworld-env``) and skip
without it; ``make test`` builds it and sets ``ROBO_PIPE_METAWORLD_PYTHON``, so in CI they fail
rather than skip when it is missing. The main environment never imports Meta-World.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from robo_pipe.errors import RoboPipeError
from robots.sawyer import SAWYER
from sim_scenes.metaworld.client import MetaWorldEnv, MetaWorldWorkerError
from sim_scenes.metaworld.env import ENV_VAR, MetaWorldMissingError
from sim_scenes.worker_process import WorkerRefusal
from tests.conftest import needs_metaworld

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64


@pytest.fixture(scope="module")
def mw() -> Iterator[MetaWorldEnv]:
    """One worker for the module, 64 px frames from the ``corner2`` camera."""
    with MetaWorldEnv("corner2", SIZE) as env:
        yield env


def expert_episode(env: MetaWorldEnv, task: str, seed: int) -> tuple[bool, int]:
    """(solved, steps) of the scripted expert on one seeded episode, stopping at success."""
    env.reset(task, seed)
    for step in range(1, env.max_steps + 1):
        if env.step(env.expert_action()).success:
            return True, step
    return False, env.max_steps


@needs_metaworld
@pytest.mark.parametrize(("task", "seeds"), [("reach-v3", (0, 1, 2)), ("drawer-close-v3", (0, 1))])
def test_the_scripted_expert_solves_its_task(
    mw: MetaWorldEnv, task: str, seeds: tuple[int, ...]
) -> None:
    results = [expert_episode(mw, task, seed) for seed in seeds]
    assert all(solved for solved, _ in results), results
    # the episodes end well before the cap: an expert that wanders in by chance would not
    assert max(steps for _, steps in results) < mw.max_steps // 2, results


@needs_metaworld
def test_images_have_the_asked_size_move_with_the_robot_and_repeat_with_the_seed(
    mw: MetaWorldEnv,
) -> None:
    def frames(task: str, seed: int) -> tuple[list[np.ndarray], np.ndarray]:
        obs = mw.reset(task, seed)
        images = [obs.image]
        for _ in range(4):
            obs = mw.step(mw.expert_action()).obs
            images.append(obs.image)
        return images, obs.state

    first, state = frames("reach-v3", 7)
    assert first[0].shape == (SIZE, SIZE, 3) and first[0].dtype == np.uint8
    assert state.shape == (4,)
    assert all(not np.array_equal(a, b) for a, b in itertools.pairwise(first))
    other, _ = frames("drawer-close-v3", 3)  # another task's physics in between
    again, state_again = frames("reach-v3", 7)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    np.testing.assert_array_equal(state, state_again)
    # another seed is another layout: the goal (the end of Meta-World's observation) moves
    assert not np.array_equal(mw.reset("reach-v3", 8).env_state, mw.reset("reach-v3", 7).env_state)
    assert not np.array_equal(other[0], first[0])


@needs_metaworld
def test_an_unknown_task_is_refused_by_name(mw: MetaWorldEnv) -> None:
    with pytest.raises(WorkerRefusal, match="reach-v3") as err:
        mw.reset("reach-v9", 0)
    assert isinstance(err.value, RoboPipeError) and "reach-v9" in str(err.value)
    mw.reset("reach-v3", 0)  # the worker serves on


@needs_metaworld
def test_an_unknown_camera_is_refused_by_name_before_any_episode() -> None:
    with pytest.raises(WorkerRefusal, match=r"'corner9'.*corner2"):
        MetaWorldEnv("corner9", SIZE)


def test_a_missing_environment_is_a_named_error_before_any_work(tmp_path: Path) -> None:
    """Through the benchmark script a user runs: exit 2, no traceback, ``make metaworld-env``
    named; the client raises before starting a process."""
    missing = tmp_path / "nope" / "python"
    result = subprocess.run(
        [sys.executable, "benchmarks/metaworld.py", "--quick"],
        cwd=ROOT,
        env={**os.environ, ENV_VAR: str(missing), "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "make metaworld-env" in text and "nope/python" in text
    assert "steps/s" not in result.stdout  # no measurement began


def test_a_missing_environment_starts_no_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_VAR, str(tmp_path / "nope" / "python"))
    started = []
    monkeypatch.setattr(subprocess, "Popen", lambda *a, **k: started.append(a))
    with pytest.raises(MetaWorldMissingError, match="make metaworld-env"):
        MetaWorldEnv()
    assert started == []


def test_a_worker_that_dies_is_reported_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'mujoco: cannot load libGL' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv(ENV_VAR, str(fake))
    with pytest.raises(MetaWorldWorkerError, match="exited with code 3") as err:
        MetaWorldEnv()
    assert "cannot load libGL" in str(err.value)


@needs_metaworld
def test_the_declared_sawyer_is_the_robot_meta_world_drives(mw: MetaWorldEnv) -> None:
    """robots/sawyer states Meta-World's Sawyer without its MJCF: its rate, hand step, cameras
    and the sizes of its state and action are what the worker reports for a real episode."""
    obs = mw.reset("reach-v3", 0)
    assert SAWYER.control_hz == pytest.approx(1.0 / mw.control_period_s)
    assert SAWYER.action.scale[:3] == (mw.action_scale,) * 3
    assert {c.name: c.fovy_deg for c in SAWYER.cameras} == pytest.approx(mw.camera_fovy)
    assert obs.state.shape == (SAWYER.state_dim,)
    # The gripper's opening is normalised to 0..1; the hand is inside the robot's workspace.
    assert 0.0 <= obs.state[3] <= 1.0 and SAWYER.action.dim == 4

    # Hand deltas move the hand by their scale (0.01 m a unit; 5 units: 5 cm), as chunk_targets
    # plans; the hold action keeps it still (the hand settles after a reset and follows its
    # mocap target with a lag, so both get steps to settle).
    def hold(state: np.ndarray, steps: int) -> np.ndarray:
        for _ in range(steps):
            state = mw.step(SAWYER.hold_action(state)).obs.state
        return state

    start = hold(obs.state, 20)
    push = np.array([[1.0, 0.0, 0.0, -1.0]] * 5, np.float32)
    planned = SAWYER.chunk_targets(push, start)[-1, 0] * SAWYER.action.scale[0]
    assert planned == pytest.approx(start[0] + 0.05)
    state = start
    for action in push:
        state = mw.step(action).obs.state
    assert hold(state, 40)[0] == pytest.approx(planned, abs=5e-3)
