"""The Isaac Lab backend (``sim.backend: isaaclab``) on CPU: the same task, seeds and units as
MuJoCo, cameras rendered by the Newton Warp ray tracer, determinism, autoreset, the evaluation
verb through it, and clear errors when its environment is missing or its worker fails.

Tests marked ``isaaclab`` need the Isaac Lab environment (``make isaaclab-env``) and skip
without it; ``make test`` builds it and sets ``ROBO_PIPE_ISAACLAB_PYTHON``, so in CI they fail
rather than skip when it is missing. The main environment never imports Isaac Lab: the backend
runs it in a worker process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from robots.spec import RobotSpec
from sim_scenes.backends import make_env, open_env
from sim_scenes.batched_env import BatchedEnv, StepResult
from sim_scenes.config import RewardConfig, SceneConfig, SimConfig, SuccessConfig
from sim_scenes.episodes import play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.isaaclab.client import IsaacLabWorkerError
from sim_scenes.isaaclab.env import ENV_VAR, isaaclab_python
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.seeds import episode_seeds, next_episode_seed
from sim_scenes.touch import COLOURS, Phrasing, get_variant, sample_layout, touch_variant
from sim_scenes.touch_task import TOUCH
from tests.conftest import needs_isaaclab

ROOT = Path(__file__).resolve().parents[2]
SEEDS = [1, 2, 3, 4]


def isaac(
    rp5: RobotSpec,
    n: int,
    cameras: tuple[str, ...],
    autoreset: bool,
    scene: SceneConfig | None = None,
    phrasing: Phrasing = "trained",
) -> BatchedEnv:
    sim = SimConfig(backend="isaaclab", num_envs=n)
    scene = scene or SceneConfig()
    return make_env(rp5, scene, sim, cameras=cameras, autoreset=autoreset, phrasing=phrasing)


@pytest.fixture(scope="module")
def camera_env(rp5: RobotSpec) -> Iterator[BatchedEnv]:
    """Four environments with the scene and wrist cameras, no autoreset (one worker start)."""
    with isaac(rp5, 4, ("scene", "wrist"), autoreset=False) as env:
        yield env


@needs_isaaclab
def test_same_scene_state_and_instruction_as_mujoco(rp5: RobotSpec, camera_env: BatchedEnv) -> None:
    obs = camera_env.reset(SEEDS)
    with MujocoBatchedEnv(rp5, get_variant("touch-mixed"), 4, cameras=(), autoreset=False) as mj:
        expected = mj.reset(SEEDS)
        truth = mj.privileged()
    assert obs.instruction == expected.instruction
    np.testing.assert_allclose(obs.state, expected.state, atol=1e-5)
    got = camera_env.privileged()
    for key in ("tcp_pos", "target_pos", "arm_qpos"):
        np.testing.assert_allclose(got[key], truth[key], atol=1e-4, err_msg=key)


@needs_isaaclab
def test_cameras_render_the_named_object(camera_env: BatchedEnv) -> None:
    obs = camera_env.reset(SEEDS)
    for name in ("scene", "wrist"):
        image = obs.images[name]
        assert image.shape == (4, 64, 64, 3) and image.dtype == np.uint8
        assert image.reshape(4, -1).std(axis=1).min() > 5, f"{name} camera renders a flat image"
    # The scene camera sees every object: the named one's colour is in its image, and the
    # wrist camera (on a moving link) differs between environments whose arms differ.
    for env, instruction in enumerate(obs.instruction):
        colour = next(c for c in COLOURS if f" {c} " in instruction)
        rgb = np.array(COLOURS[colour]) * 255
        distance = np.abs(obs.images["scene"][env].astype(float) - rgb).sum(axis=-1)
        assert (distance < 90).sum() >= 3, f"no {colour} pixels for {instruction!r}"
    assert not np.array_equal(obs.images["wrist"][0], obs.images["wrist"][1])


@needs_isaaclab
def test_same_seeds_and_actions_give_identical_observations(
    rp5: RobotSpec, camera_env: BatchedEnv
) -> None:
    runs = []
    for _ in range(2):
        rng = np.random.default_rng(0)
        obs = camera_env.reset(SEEDS)
        states, images = [obs.state], [obs.images["scene"]]
        for _ in range(4):
            actions = rng.uniform(rp5.action.low, rp5.action.high, size=(4, rp5.action.dim))
            result = camera_env.step(actions)
            states.append(result.obs.state)
            images.append(result.obs.images["scene"])
        runs.append((np.stack(states), np.stack(images)))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    assert not np.array_equal(runs[0][0][0], runs[0][0][-1]), "the arm never moved"


@needs_isaaclab
def test_scripted_expert_solves_the_same_episodes_in_the_same_steps(rp5: RobotSpec) -> None:
    """Physics agree: the expert's episodes end alike on both engines (servo gains, gravity
    compensation, joint limits and the control period all carried over from the MJCF)."""
    seeds = episode_seeds(0, 8, "eval")
    expert = ScriptedExpert(rp5)
    with isaac(rp5, 8, (), autoreset=False) as env:
        isaac_records = play_episodes(env, expert, seeds, signals=TOUCH.episode_signals)
    variant = get_variant("touch-mixed")
    with MujocoBatchedEnv(rp5, variant, 8, cameras=(), autoreset=False) as env:
        mujoco_records = play_episodes(env, expert, seeds, signals=TOUCH.episode_signals)
    assert all(r.success for r in isaac_records)
    pairs = list(zip(isaac_records, mujoco_records, strict=True))
    assert all(abs(a.length - b.length) <= 1 for a, b in pairs), pairs
    for a, b in pairs:  # the distances the failure breakdown reads agree too
        assert abs(a.signals["closest_target"] - b.signals["closest_target"]) < 0.01
        assert abs(a.signals["closest_distractor"] - b.signals["closest_distractor"]) < 0.01
        assert abs(a.signals["final_target"] - b.signals["final_target"]) < 0.01


@needs_isaaclab
def test_the_scene_configs_task_overrides_reach_isaac_lab(rp5: RobotSpec) -> None:
    """A tighter radius held longer, and a shorter episode, as on MuJoCo (whose episodes of
    the variant's own task the expert test above matches to a step); the unseen phrasing
    (``phrasing``, an evaluation option) words the instructions as on MuJoCo."""
    seeds = episode_seeds(0, 4, "eval")
    expert = ScriptedExpert(rp5)
    # RL's reward terms too (SceneConfig.rl_task): Isaac Lab's own reward is what RL reads.
    strict = SceneConfig(
        success=SuccessConfig(radius=0.035, hold_steps=4),
        reward=RewardConfig(progress_weight=2.0),
    )
    with MujocoBatchedEnv(rp5, strict.task(), 4, cameras=(), autoreset=False) as env:
        on_mujoco = play_episodes(env, expert, seeds, signals=TOUCH.episode_signals)
    rewards: list[tuple[np.ndarray, np.ndarray]] = []

    def paid(slots: list[int], obs: object, actions: object, result: StepResult) -> None:
        d, before = result.info["tcp_target_distance"], result.info["tcp_target_distance_before"]
        rewards.append(
            (result.reward, touch_variant(strict.rl_task()).reward(result.success, d, before))
        )

    sim = SimConfig(backend="isaaclab", num_envs=4)
    with open_env(
        rp5, strict.rl_task(), sim, num_envs=4, cameras=(), image_size=64, autoreset=False
    ) as isaac_env:
        tighter = play_episodes(
            isaac_env, expert, seeds, on_step=paid, signals=TOUCH.episode_signals
        )
    for got, expected in rewards:
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    short = SceneConfig(episode_steps=3)
    with isaac(rp5, 4, (), autoreset=False, scene=short, phrasing="unseen") as isaac_env:
        cut = play_episodes(isaac_env, expert, seeds, signals=TOUCH.episode_signals)
    unseen = [
        sample_layout(touch_variant(short.task()), rp5, s, phrasing="unseen").instruction
        for s in seeds
    ]
    assert [r.instruction for r in cut] == unseen
    assert all(r.success for r in tighter)
    assert all(abs(a.length - b.length) <= 1 for a, b in zip(tighter, on_mujoco, strict=True))
    assert all(r.signals["closest_target"] < 0.035 for r in tighter)
    assert [r.length for r in cut] == [3] * 4 and not any(r.success for r in cut)


@needs_isaaclab
def test_autoreset_starts_the_next_seeded_episode_like_mujoco(rp5: RobotSpec) -> None:
    expert = ScriptedExpert(rp5)
    with isaac(rp5, 2, (), autoreset=True) as env:
        obs = env.reset([5, 6])
        for _ in range(30):
            result = env.step(expert.act(env))
            if len(result.final.env_ids):
                break
        assert len(result.final.env_ids), "no episode ended in 30 steps"
        env_id = int(result.final.env_ids[0])
        assert result.final.seeds[0] == [5, 6][env_id]
        assert result.final.length[0] > 0
        assert result.final.success[0]
        assert result.obs.instruction[env_id] != "" and obs is not None
        next_seed = next_episode_seed([5, 6][env_id], 1)
    with MujocoBatchedEnv(rp5, get_variant("touch-mixed"), 1, cameras=(), autoreset=False) as mj:
        expected = mj.reset([next_seed])
    assert result.obs.instruction[env_id] == expected.instruction[0]
    np.testing.assert_allclose(result.obs.state[env_id], expected.state[0], atol=1e-5)


@needs_isaaclab
def test_evaluate_verb_runs_an_export_on_isaaclab(export_dir: Path, tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "evaluate",
            str(export_dir),
            "--set",
            "sim.backend=isaaclab",
            "--set",
            "evaluate.workers=0",
            "--set",
            "evaluate.variants=[touch-mixed]",
            "--episodes",
            "4",
            "--json",
        ],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(tmp_path / "home"), "COLUMNS": "400"},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 4
    assert [row["variant"] for row in report["rows"]] == ["touch-mixed"]


def test_missing_isaaclab_environment_is_a_named_error_before_any_work(tmp_path: Path) -> None:
    home = tmp_path / "home"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines.cli",
            "expert",
            "--episodes",
            "2",
            "--set",
            "sim.backend=isaaclab",
        ],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home), ENV_VAR: str(tmp_path / "nope/python")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    text = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    assert "make isaaclab-env" in text and "nope/python" in text
    assert not (home / "runs").exists() or not any((home / "runs").iterdir())


def test_a_worker_that_dies_is_reported_with_its_log(
    rp5: RobotSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'Warp: kernel cache is corrupt' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv(ENV_VAR, str(fake))
    with pytest.raises(IsaacLabWorkerError, match="exited with code 3") as err:
        isaac(rp5, 2, (), autoreset=False)
    assert "kernel cache is corrupt" in str(err.value)


@needs_isaaclab
def test_the_registered_task_builds_a_complete_config() -> None:
    """Isaac Lab's own tools (``parse_env_cfg``, ``gym.make``) get robot, objects and cameras."""
    code = (
        "from isaaclab_tasks.utils.parse_cfg import load_cfg_from_registry\n"
        "import sim_scenes.isaaclab.touch_env as t\n"
        "cfg = load_cfg_from_registry(t.TASK_ID, 'env_cfg_entry_point')\n"
        "print(cfg.scene.robot.prim_path, len(cfg.scene.objects.rigid_objects), "
        "cfg.scene.camera_scene.width, cfg.decimation)\n"
    )
    result = subprocess.run(
        [str(isaaclab_python()), "-c", code],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == "{ENV_REGEX_NS}/Robot 8 64 10"
