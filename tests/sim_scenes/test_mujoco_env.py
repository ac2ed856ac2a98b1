"""The batched MuJoCo backend: determinism, batching, autoreset, rendering, bad input, the
distances it reports, and the task overrides of the scene config."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from robots.spec import RobotSpec
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedEnv, BatchedObservation, StepResult
from sim_scenes.config import SceneConfig, SimConfig, SuccessConfig
from sim_scenes.episodes import EpisodeRecord, play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.touch import OBJECT_HALF_HEIGHT, SceneError, get_variant
from sim_scenes.touch_task import TOUCH
from tests.conftest import NUM_ENVS

VARIANT = get_variant("touch-mixed")


def random_actions(rp5: RobotSpec, rng: np.random.Generator, n: int) -> np.ndarray:
    low, high = np.array(rp5.action.low), np.array(rp5.action.high)
    return rng.uniform(low, high, size=(n, rp5.action.dim))


def test_same_seeds_and_actions_give_identical_observations(rp5: RobotSpec) -> None:
    runs = []
    for _ in range(2):
        rng = np.random.default_rng(0)
        with MujocoBatchedEnv(rp5, VARIANT, NUM_ENVS, cameras=("scene",)) as env:
            obs = env.reset([1, 2, 3, 4])
            states, images = [obs.state], [obs.images["scene"]]
            for _ in range(8):
                result = env.step(random_actions(rp5, rng, NUM_ENVS))
                states.append(result.obs.state)
                images.append(result.obs.images["scene"])
            runs.append((np.stack(states), np.stack(images), env.physics_state))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1], runs[1][1])
    np.testing.assert_array_equal(runs[0][2], runs[1][2])


def test_batched_and_single_environment_stepping_agree(rp5: RobotSpec) -> None:
    seeds = [11, 12, 13]
    actions = random_actions(rp5, np.random.default_rng(1), 10 * len(seeds)).reshape(10, 3, -1)
    with MujocoBatchedEnv(rp5, VARIANT, 3, cameras=(), num_threads=2, autoreset=False) as env:
        env.reset(seeds)
        for a in actions:
            env.step(a)
        batched = env.physics_state
    for i, seed in enumerate(seeds):
        with MujocoBatchedEnv(rp5, VARIANT, 1, cameras=(), num_threads=1, autoreset=False) as one:
            one.reset([seed])
            for a in actions:
                one.step(a[i : i + 1])
            np.testing.assert_array_equal(one.physics_state[0], batched[i])


def test_finished_environments_reset_independently(rp5: RobotSpec) -> None:
    with MujocoBatchedEnv(rp5, VARIANT, 2, cameras=()) as env:
        env.reset([5, 6])
        hold = np.zeros((2, rp5.action.dim))
        for _ in range(VARIANT.episode_steps - 1):
            result = env.step(hold)
            assert not result.truncated.any()
        # Env 1 restarts now; env 0 is made to restart later by a fresh reset of it alone.
        env.reset_envs([0], [9])
        result = env.step(hold)
        assert result.truncated.tolist() == [False, True]
        assert result.final.env_ids.tolist() == [1]
        assert result.final.seeds.tolist() == [6]
        assert result.final.length.tolist() == [VARIANT.episode_steps]
        assert not result.final.success.any()
        # The new episode of env 1 is a different, deterministic scene.
        assert env.layouts[1].seed != 6
        assert env.layouts[0].seed == 9


def test_render_shapes_and_images_change_when_things_move(rp5: RobotSpec) -> None:
    with MujocoBatchedEnv(rp5, VARIANT, 2, cameras=("scene", "wrist"), image_size=48) as env:
        obs = env.reset([21, 22])
        for cam in ("scene", "wrist"):
            assert obs.images[cam].shape == (2, 48, 48, 3)
            assert obs.images[cam].dtype == np.uint8
            assert obs.images[cam].std() > 5, "a rendered scene is not a flat colour"
        # Different seeds place the objects differently.
        assert np.abs(obs.images["scene"][0].astype(int) - obs.images["scene"][1]).mean() > 1
        before = obs.images["scene"].copy()
        action = np.zeros((2, rp5.action.dim))
        action[:, 0] = rp5.authored.max_joint_delta  # swing the base
        for _ in range(3):
            obs = env.step(action).obs
        assert np.abs(obs.images["scene"].astype(int) - before).mean() > 0.5
    assert obs.state.shape == (2, rp5.state_dim)


def test_actions_are_clipped_to_the_robot_limits(rp5: RobotSpec) -> None:
    with MujocoBatchedEnv(rp5, VARIANT, 1, cameras=()) as env:
        start = env.reset([3]).state[0]
        huge = np.full((1, rp5.action.dim), 10.0)
        state = env.step(huge).obs.state[0]
    moved = np.abs(state[:-1] - start[:-1])
    assert (moved <= rp5.authored.max_joint_delta + 1e-3).all()
    assert state[-1] <= rp5.max_gripper_opening + 1e-3


@pytest.mark.parametrize("num_envs", [0, -3])
def test_non_positive_env_counts_are_rejected(rp5: RobotSpec, num_envs: int) -> None:
    with pytest.raises(SceneError, match=f"num_envs must be >= 1, got {num_envs}"):
        MujocoBatchedEnv(rp5, VARIANT, num_envs)


def test_unknown_camera_and_bad_shapes_are_rejected(rp5: RobotSpec) -> None:
    with pytest.raises(SceneError, match=r"unknown camera 'top'.*valid choices: scene, wrist"):
        MujocoBatchedEnv(rp5, VARIANT, 1, cameras=("top",))
    with MujocoBatchedEnv(rp5, VARIANT, 2, cameras=()) as env:
        with pytest.raises(SceneError, match="reset needs 2 seeds"):
            env.reset([1])
        env.reset([1, 2])
        with pytest.raises(SceneError, match=r"actions must have shape \(2, 6\)"):
            env.step(np.zeros((2, 5)))


def test_the_distance_to_the_nearest_other_object_is_reported(rp5: RobotSpec) -> None:
    rng = np.random.default_rng(3)
    with MujocoBatchedEnv(rp5, VARIANT, 3, cameras=(), autoreset=False) as env:
        env.reset([21, 22, 23])
        for _ in range(4):
            result = env.step(random_actions(rp5, rng, 3))
        tcp = env.privileged()["tcp_pos"]
        for e, layout in enumerate(env.layouts):
            others = [
                np.linalg.norm(tcp[e] - np.array([*o.xy, OBJECT_HALF_HEIGHT]))
                for k, o in enumerate(layout.objects)
                if k != layout.target
            ]
            assert len(others) == 2, "touch-mixed: three objects, two of them distractors"
            # objects rest where the layout put them (a random arm may nudge one slightly)
            assert result.info["tcp_distractor_distance"][e] == pytest.approx(min(others), abs=2e-3)


def test_play_episodes_keeps_each_episodes_closest_approaches(rp5: RobotSpec) -> None:
    rng = np.random.default_rng(4)
    seen: dict[int, list[tuple[float, float]]] = {}

    def act(env: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
        return random_actions(rp5, rng, env.num_envs)

    def on_step(slots: list[int], obs: object, actions: object, result: StepResult) -> None:
        for e, i in enumerate(slots):
            if i >= 0:
                seen.setdefault(i, []).append(
                    (
                        float(result.info["tcp_target_distance"][e]),
                        float(result.info["tcp_distractor_distance"][e]),
                    )
                )

    short = replace(VARIANT, episode_steps=6)  # 2 envs play 5 episodes: every env restarts
    with MujocoBatchedEnv(rp5, short, 2, cameras=(), autoreset=False) as env:
        records = play_episodes(
            env, act, [31, 32, 33, 34, 35], on_step=on_step, signals=TOUCH.episode_signals
        )
    for r in records:
        target, distractor = zip(*seen[r.index], strict=True)
        assert len(target) == r.length
        assert r.signals["closest_target"] == min(target)
        assert r.signals["closest_distractor"] == min(distractor)
        assert r.signals["final_target"] == target[-1]


def test_the_tcp_on_its_target_is_farther_from_every_other_object(rp5: RobotSpec) -> None:
    # Objects stand at least min_separation apart, so a tcp d from the target's centre is at
    # least min_separation - d from any other: a solved episode is never a wrong-object one.
    solved: list[tuple[float, float]] = []

    def on_step(slots: list[int], obs: object, actions: object, result: StepResult) -> None:
        for e in np.flatnonzero(result.success):
            if slots[e] >= 0:
                solved.append(
                    (
                        float(result.info["tcp_target_distance"][e]),
                        float(result.info["tcp_distractor_distance"][e]),
                    )
                )

    with MujocoBatchedEnv(rp5, VARIANT, 2, cameras=(), autoreset=False) as env:
        records = play_episodes(
            env, ScriptedExpert(rp5), [51, 52], on_step=on_step, signals=TOUCH.episode_signals
        )
    assert len(solved) == 2 and all(r.success for r in records)
    for target, distractor in solved:
        assert target < VARIANT.success.radius
        assert distractor >= VARIANT.min_separation - target - 2e-3  # objects nudged by the arm
    assert all(r.signals["closest_distractor"] > r.signals["closest_target"] for r in records)


def test_the_scene_config_overrides_the_success_radius_hold_and_episode_length(
    rp5: RobotSpec,
) -> None:
    seeds = [41, 42, 43, 44]

    def expert_episodes(scene: SceneConfig) -> list[EpisodeRecord]:
        env = make_env(
            rp5, scene, SimConfig(num_threads=1), num_envs=4, cameras=(), autoreset=False
        )
        with env:
            return play_episodes(env, ScriptedExpert(rp5), seeds, signals=TOUCH.episode_signals)

    default = expert_episodes(SceneConfig())
    strict = expert_episodes(SceneConfig(success=SuccessConfig(radius=0.035, hold_steps=4)))
    cut = expert_episodes(SceneConfig(episode_steps=3))
    assert all(r.success for r in default)
    assert all(s.length >= d.length + 2 for s, d in zip(strict, default, strict=True)), (
        "closer and held longer takes the expert longer"
    )
    assert all(r.signals["closest_target"] < 0.035 for r in strict if r.success)
    assert [r.length for r in cut] == [3] * 4 and not any(r.success for r in cut)
    assert SceneConfig().task_overrides() == {}, "unset: cache keys as before"
    assert SceneConfig(episode_steps=3).task() == replace(VARIANT, episode_steps=3)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"success": {"radius": 0.0}}, "success.radius"),
        ({"success": {"radius": 0.6}}, "success.radius"),
        ({"success": {"hold_steps": 0}}, "success.hold_steps"),
        ({"success": {"hold_steps": 101}}, "success.hold_steps"),
        ({"success": {"hold_steps": 2.0}}, "success.hold_steps"),  # strict: no float to int
        ({"success": {"tolerance": 0.05}}, "success.tolerance"),  # not a field
        ({"episode_steps": 0}, "episode_steps"),
        ({"episode_steps": 10_001}, "episode_steps"),
    ],
)
def test_impossible_task_overrides_are_refused(overrides: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError, match=rf"(?m)^{field}$"):
        SceneConfig.model_validate(overrides)
