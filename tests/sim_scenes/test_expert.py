"""The scripted expert solves the task; a random policy almost never does."""

from __future__ import annotations

import numpy as np

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation
from sim_scenes.episodes import play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.mujoco.mujoco_env import MujocoBatchedEnv
from sim_scenes.seeds import episode_seeds
from sim_scenes.touch import get_variant


def test_expert_succeeds_on_at_least_95_percent_of_200_random_scenes(rp5: RobotSpec) -> None:
    seeds = episode_seeds(0, 200, "eval")
    with MujocoBatchedEnv(rp5, get_variant("touch-mixed"), 16, cameras=(), autoreset=False) as env:
        records = play_episodes(env, ScriptedExpert(rp5), seeds)
    assert [r.seed for r in records] == seeds
    assert np.mean([r.success for r in records]) >= 0.95


def test_expert_solves_the_held_out_clutter_variant(rp5: RobotSpec) -> None:
    seeds = episode_seeds(1, 40, "eval")
    variant = get_variant("touch-mixed-clutter")
    with MujocoBatchedEnv(rp5, variant, 8, cameras=(), autoreset=False) as env:
        records = play_episodes(env, ScriptedExpert(rp5), seeds)
    assert np.mean([r.success for r in records]) >= 0.9


def test_random_policy_rarely_succeeds(rp5: RobotSpec) -> None:
    rng = np.random.default_rng(0)
    low, high = np.array(rp5.action.low), np.array(rp5.action.high)

    def random_policy(env: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
        return rng.uniform(low, high, size=(env.num_envs, len(low)))

    with MujocoBatchedEnv(rp5, get_variant("touch-mixed"), 16, cameras=(), autoreset=False) as env:
        records = play_episodes(env, random_policy, episode_seeds(0, 100, "eval"))
    assert np.mean([r.success for r in records]) <= 0.1


def test_results_per_seed_do_not_depend_on_the_batch_size(rp5: RobotSpec) -> None:
    seeds = episode_seeds(2, 12, "eval")
    outcomes = []
    for n in (1, 5):
        with MujocoBatchedEnv(
            rp5, get_variant("touch-mixed"), n, cameras=(), autoreset=False
        ) as env:
            records = play_episodes(env, ScriptedExpert(rp5), seeds)
        outcomes.append([(r.seed, r.success, r.length, r.episode_return) for r in records])
    assert outcomes[0] == outcomes[1]
