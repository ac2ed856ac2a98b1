"""Meta-World through its worker processes, as the ``metaworld`` backend and task family: the
scripted experts solve their tasks, camera images have the asked size, move with the robot and
repeat with the seed whatever the number of workers, episodes reset themselves at their cap, and
a missing environment, an unknown camera, or a dead worker each get a clear error.

Tests marked ``metaworld`` need the Meta-World environment (``make metaworld-env``) and skip
without it; ``make test`` builds it and sets ``ROBO_PIPE_METAWORLD_PYTHON``, so in CI they fail
rather than skip when it is missing. The main environment never imports Meta-World.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from robots.sawyer import SAWYER
from sim_scenes.episodes import play_episodes
from sim_scenes.errors import SceneError
from sim_scenes.metaworld.batched import MetaWorldBatchedEnv, MetaWorldWorkerError
from sim_scenes.metaworld.env import ENV_VAR, MetaWorldMissingError
from sim_scenes.metaworld.tasks import METAWORLD, MT10_TASKS, REACH_M, MetaWorldVariant
from sim_scenes.seeds import episode_seeds
from tests.conftest import needs_metaworld

ROOT = Path(__file__).resolve().parents[2]
SIZE = 64


def open_env(
    variant: str | MetaWorldVariant, num_envs: int = 2, workers: int = 2, **kwargs: object
) -> MetaWorldBatchedEnv:
    spec = METAWORLD.variant(variant) if isinstance(variant, str) else variant
    return MetaWorldBatchedEnv(
        SAWYER,
        spec,
        num_envs,
        ("corner2",),
        SIZE,
        workers=workers,
        **kwargs,  # type: ignore[arg-type]
    )


@pytest.fixture(scope="module")
def mt2() -> Iterator[MetaWorldBatchedEnv]:
    """Two envs of the two-task variant in two workers, as evaluation plays them."""
    with open_env("mt2", autoreset=False) as env:
        yield env


@needs_metaworld
def test_the_scripted_experts_solve_their_tasks(mt2: MetaWorldBatchedEnv) -> None:
    seeds = list(range(6))  # both tasks: a seed's task is seed % 2
    records = play_episodes(mt2, METAWORLD.expert(SAWYER), seeds, signals=METAWORLD.episode_signals)
    assert {mt2.variant.episode_task(s) for s in seeds} == set(mt2.variant.tasks)
    assert all(r.success for r in records), [(r.seed, r.length) for r in records]
    # the episodes end well before the cap: an expert that wanders in by chance would not
    assert max(r.length for r in records) < mt2.variant.episode_steps // 2
    # the family's failure signals are measured: the hand came to its object (reach: the goal)
    assert all(r.signals["closest_target"] < REACH_M for r in records), [r.signals for r in records]
    assert {METAWORLD.failure_mode(True, r.signals, mt2.variant) for r in records} == {""}
    instructions = {r.instruction for r in records}
    assert instructions <= set(METAWORLD.instructions()) and len(instructions) >= 2


@needs_metaworld
def test_images_move_with_the_robot_and_repeat_with_the_seed_whatever_the_workers(
    mt2: MetaWorldBatchedEnv,
) -> None:
    def frames(env: MetaWorldBatchedEnv, seeds: list[int]) -> tuple[list[np.ndarray], np.ndarray]:
        obs = env.reset(seeds)
        images = [obs.images["corner2"]]
        for _ in range(4):
            obs = env.step(env.expert_actions()).obs
            images.append(obs.images["corner2"])
        return images, obs.state

    first, state = frames(mt2, [7, 8])
    assert first[0].shape == (2, SIZE, SIZE, 3) and first[0].dtype == np.uint8
    assert state.shape == (2, SAWYER.state_dim)
    assert all(not np.array_equal(a, b) for a, b in itertools.pairwise(first))
    assert not np.array_equal(first[0][0], first[0][1]), "two tasks, two scenes"
    with open_env("mt2", num_envs=2, workers=1, autoreset=False) as one_worker:
        again, state_again = frames(one_worker, [7, 8])
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    np.testing.assert_array_equal(state, state_again)
    # another seed of the same task is another layout: its goal moves
    obs = mt2.reset([7, 9])
    goal = mt2.privileged()["goal_pos"]
    assert mt2.variant.episode_task(7) == mt2.variant.episode_task(9)
    assert not np.array_equal(goal[0], goal[1])
    assert METAWORLD.env_state(mt2).shape == (2, len(METAWORLD.env_state_names))
    # ... and the policy's state says where (MT10 observes its goal: robots/sawyer)
    names = list(SAWYER.state_names)
    np.testing.assert_allclose(obs.state[:, names.index("goal.x") :], goal, atol=1e-6)


@needs_metaworld
def test_an_episode_at_its_cap_resets_itself_with_its_next_seed() -> None:
    """Same-step autoreset: the step that reaches the cap reports the episode and returns the
    next episode's first observation; a still arm never succeeds, so every episode is cut."""
    short = replace(METAWORLD.variant("door-open"), episode_steps=3)
    with open_env(short, num_envs=1, workers=1) as env:
        first = env.reset([5]).images["corner2"]
        hold = np.array([[0.0, 0.0, 0.0, -1.0]], np.float32)
        results = [env.step(hold) for _ in range(3)]
    assert [len(r.final.env_ids) for r in results] == [0, 0, 1]
    end = results[-1]
    assert end.truncated[0] and not end.success[0] and end.final.length.tolist() == [3]
    assert end.final.seeds.tolist() == [5]
    assert not np.array_equal(end.obs.images["corner2"][0], first), "a new layout"


@needs_metaworld
def test_rl_reward_terms_replace_meta_worlds_own_and_pay_for_closing_the_distance() -> None:
    """Without ``scene.reward`` a step pays Meta-World's own reward; with terms it pays the
    terms over the distance the task must close (reach: hand to goal), measured from the
    episode's start: progress for the expert's approach, the bonus once on success."""
    from sim_scenes.config import RewardConfig, SceneConfig, SuccessConfig

    scene = SceneConfig(variant="metaworld/reach", reward=RewardConfig(progress_weight=10.0))
    shaped, own = scene.rl_task(), scene.task()
    assert isinstance(shaped, MetaWorldVariant) and isinstance(own, MetaWorldVariant)
    assert own.reward is None and shaped.reward is not None
    assert (shaped.reward.progress_weight, shaped.reward.success_bonus) == (10.0, 1.0)
    with pytest.raises(ValueError, match=r"scene\.success"):
        SceneConfig(variant="metaworld/reach", success=SuccessConfig(radius=0.02))

    def episode(variant: MetaWorldVariant) -> tuple[list[float], list[float], bool]:
        with open_env(variant, num_envs=1, workers=1, autoreset=False) as env:
            env.reset([3])
            start = float(
                np.linalg.norm(env.privileged()["tcp_pos"] - env.privileged()["goal_pos"])
            )
            rewards, distances = [], [start]
            while True:
                result = env.step(env.expert_actions())
                rewards.append(float(result.reward[0]))
                distances.append(float(result.info["target_goal_distance"][0]))
                if result.terminated[0] or result.truncated[0]:
                    return rewards, distances, bool(result.success[0])

    meta_world, _, solved = episode(own)
    terms, distances, solved_again = episode(shaped)
    assert solved and solved_again and len(meta_world) == len(terms)
    assert max(meta_world) > 1.0, "Meta-World's own reward: up to 10 a step"
    expected = 10.0 * -np.diff(distances) - 0.1 * np.array(distances[1:])
    expected[-1] += 1.0  # the success bonus, on the solving step only
    np.testing.assert_allclose(terms, expected, atol=1e-5)


@needs_metaworld
def test_an_unknown_camera_is_refused_by_name_before_any_worker_starts() -> None:
    with pytest.raises(SceneError, match=r"'corner9'.*corner2"):
        MetaWorldBatchedEnv(SAWYER, METAWORLD.variant("reach"), 1, ("corner9",), SIZE)


def test_a_missing_environment_is_a_named_error_before_any_work(tmp_path: Path) -> None:
    """Through the benchmark script a user runs: exit 2, no traceback, ``make metaworld-env``
    named; the backend raises before starting a process."""
    missing = tmp_path / "nope" / "python"
    result = subprocess.run(
        [sys.executable, "benchmarks/metaworld.py", "--quick", "--experts-only"],
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
        open_env("reach")
    assert started == []


def test_a_worker_that_dies_is_reported_with_its_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'mujoco: cannot load libGL' >&2\nexit 3\n")
    fake.chmod(0o755)
    monkeypatch.setenv(ENV_VAR, str(fake))
    with pytest.raises(MetaWorldWorkerError, match="exited with code 3") as err:
        open_env("reach")
    assert "cannot load libGL" in str(err.value)


@needs_metaworld
def test_the_declared_sawyer_is_the_robot_meta_world_drives() -> None:
    """robots/sawyer states Meta-World's Sawyer without its MJCF: its rate, hand step, cameras
    and the sizes of its state and action are what the worker reports for a real episode."""
    with open_env("reach", num_envs=1, workers=1, autoreset=False) as mw:
        obs = mw.reset([0])
        assert SAWYER.control_hz == pytest.approx(1.0 / mw.control_period_s)
        assert SAWYER.action.scale[:3] == (mw.action_scale,) * 3
        assert {c.name: c.fovy_deg for c in SAWYER.cameras} == pytest.approx(mw.camera_fovy)
        assert obs.state.shape == (1, SAWYER.state_dim)
        # The gripper's opening is normalised to 0..1; the action is 4-D.
        assert 0.0 <= obs.state[0, 3] <= 1.0 and SAWYER.action.dim == 4

        # Hand deltas move the hand by their scale (0.01 m a unit; 5 units: 5 cm), as
        # chunk_targets plans; the hold action keeps it still (the hand settles after a reset
        # and follows its mocap target with a lag, so both get steps to settle).
        def hold(state: np.ndarray, steps: int) -> np.ndarray:
            for _ in range(steps):
                state = mw.step(SAWYER.hold_action(state)[None]).obs.state[0]
            return state

        start = hold(obs.state[0], 20)
        push = np.array([[1.0, 0.0, 0.0, -1.0]] * 5, np.float32)
        planned = SAWYER.chunk_targets(push, start)[-1, 0] * SAWYER.action.scale[0]
        assert planned == pytest.approx(start[0] + 0.05)
        state = start
        for action in push:
            state = mw.step(action[None]).obs.state[0]
        assert hold(state, 40)[0] == pytest.approx(planned, abs=5e-3)


def test_the_family_draws_tasks_and_words_from_the_seed_and_keeps_its_own_success() -> None:
    """No Meta-World needed: the family's answers, as collection, evaluation and pretraining
    ask them."""
    mt10 = METAWORLD.variant("mt10")
    drawn = Counter(mt10.episode_task(s) for s in episode_seeds(0, 2000, "collect"))
    assert set(drawn) == set(MT10_TASKS) and min(drawn.values()) > 150, drawn
    words = {mt10.instruction(s) for s in episode_seeds(0, 200, "eval")}
    assert words <= set(METAWORLD.instructions()) and len(words) > 20
    unseen = {mt10.instruction(s, "unseen") for s in range(50)}
    assert not unseen & set(METAWORLD.instructions())
    # a policy trained on mt10 is measured on each task alone; its base never sees them
    assert METAWORLD.eval_variants("mt10") == [t.removesuffix("-v3") for t in MT10_TASKS]
    base = METAWORLD.pretrain_variants("mt10")
    assert base and not {METAWORLD.variant(v).tasks[0] for v in base} & set(MT10_TASKS)
    assert "reach" not in METAWORLD.pretrain_variants("mt2")
    # Meta-World's success is its own; its episode cap at most its 500 steps
    with pytest.raises(SceneError, match=r"scene.success: .*radius"):
        METAWORLD.with_overrides(mt10, {"radius": 0.1}, {}, None)
    with pytest.raises(SceneError, match="500"):
        METAWORLD.with_overrides(mt10, {}, {}, 501)
    assert METAWORLD.with_overrides(mt10, {}, {}, 120).episode_steps == 120
    # why an episode failed, from the measured signals
    near, far = {"closest_target": 0.02, "closest_goal": 0.04}, {"closest_target": 0.3}
    assert METAWORLD.failure_mode(False, far, mt10) == "never_reached"
    assert METAWORLD.failure_mode(False, near, mt10) == "short_of_goal"
    assert METAWORLD.failure_mode(True, far, mt10) == ""


def test_a_touch_backend_refuses_a_meta_world_task_by_name() -> None:
    """The seam holds: MuJoCo's touch scene is not asked to play a Sawyer task."""
    from robots.spec import get_robot
    from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv

    with pytest.raises(SceneError, match="'mt10' is not a touch task"):
        MujocoBatchedEnv(get_robot("rp5"), METAWORLD.variant("mt10"), 1, cameras=())
