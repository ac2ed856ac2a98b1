"""Sharding an evaluation: a policy on a scene suite, episodes spread over Ray workers.

    suite   = variants x seeds (the run's ``eval`` seed stream; the same for every variant)
    shards  = runs of ``episodes_per_shard`` seeds of one variant
    workers = Ray actors, each a batched simulator per variant + one policy copy (batched
              inference: one call per control step for all its environments)
    for each finished shard: merge its episodes by (variant, seed index) -- a shard re-run after
              its worker died cannot count an episode twice
    a worker that dies is restarted by Ray and its shard played again (up to
    ``evaluate.max_worker_restarts`` times per worker); results never depend on which worker
    ran a shard or how many environments it had (see ``sim_scenes.episodes``)

The policy executes the first action of each predicted chunk and predicts again next step
(receding horizon). Nothing here assumes MuJoCo: environments come from ``make_env``.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robo_pipe.locks import StatusFn
from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedEnv, BatchedObservation
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.episodes import play_episodes
from sim_scenes.touch import SceneError, episode_seeds, heldout_variants
from stages.evaluate.config import EvalConfig
from stages.evaluate.failures import failure_mode
from stages.evaluate.policies import PolicySpecError, load_acting_policy
from stages.ray_runtime import node_id
from stages.worker_pool import PoolWorker, Ready


@dataclass(frozen=True)
class Shard:
    """A run of consecutive seeds of one variant."""

    variant: str
    start: int
    """Index of the first seed in the variant's seed list."""
    seeds: list[int]
    record: bool
    """Keep every episode's frames (to pick the recorded successes and failures from)."""


@dataclass
class EpisodeOutcome:
    """One evaluated episode."""

    variant: str
    index: int
    seed: int
    success: bool
    length: int
    episode_return: float
    instruction: str
    closest_target_distance: float = math.nan
    """m: closest approach of the tool centre point to the named object (nan: not reported)."""
    closest_distractor_distance: float = math.nan
    """m: closest approach to any other object (inf: none; nan: not reported)."""
    final_target_distance: float = math.nan
    """m: tool centre point to the named object after the last step (nan: not reported)."""
    failure: str = ""
    """Why it failed (:data:`stages.evaluate.failures.FAILURE_MODES`); ``""`` if solved."""


@dataclass
class ShardOutcome:
    """What a worker returns for a shard."""

    shard: Shard
    episodes: list[EpisodeOutcome]
    frames: dict[int, np.ndarray] = field(default_factory=dict)
    """Seed index -> uint8 ``(T, H, W, 3)`` frames of the first camera (recorded shards)."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds in simulate / render / inference."""
    pid: int = 0
    """Process that ran it (a pool notices a restarted worker by it)."""
    node: str = ""
    """The Ray node it ran on (``""``: in this process, ``workers: 0``)."""


def suite_variants(scene: SceneConfig, config: EvalConfig) -> list[str]:
    """The suite's variants: configured, or the held-out variants of the training variant."""
    variants = config.variants or heldout_variants(scene.variant) or [scene.variant]
    return list(variants)


def plan_shards(variants: list[str], seeds: list[int], per_shard: int) -> list[Shard]:
    """Every (variant, seed) exactly once, in shards of ``per_shard``; each variant's first
    shard is the recorded one."""
    return [
        Shard(v, start, seeds[start : start + per_shard], record=start == 0)
        for v in variants
        for start in range(0, len(seeds), per_shard)
    ]


class EvalWorker(PoolWorker):
    """A policy copy plus one batched environment per variant (a Ray actor, or in-process)."""

    def __init__(
        self,
        policy_path: str,
        robot: str,
        scene: dict[str, Any],
        sim: dict[str, Any],
        num_envs: int,
        threads: int = 1,
    ) -> None:
        self.policy = load_acting_policy(policy_path, threads)
        self.robot = get_robot(robot)
        self.scene = SceneConfig(**scene).model_copy(
            update={"cameras": list(self.policy.cameras), "image_size": self.policy.image_size}
        )
        self.sim = SimConfig(**sim).model_copy(update={"num_threads": threads})
        self.num_envs = num_envs
        self.envs: dict[str, BatchedEnv] = {}

    def _env(self, variant: str) -> BatchedEnv:
        if variant not in self.envs:
            self.envs[variant] = make_env(
                self.robot,
                self.scene.model_copy(update={"variant": variant}),
                self.sim,
                num_envs=self.num_envs,
                autoreset=False,
            )
        return self.envs[variant]

    def warm(self, variants: list[str]) -> Ready:
        """Build every variant's simulator and run the policy once, so start-up is not timed
        as evaluation."""
        for variant in variants:
            env = self._env(variant)
            self.policy.predict_chunk(env.reset([0] * env.num_envs))
        return Ready(os.getpid())

    def run(self, shard: Shard) -> ShardOutcome:
        """Play the shard's episodes."""
        env = self._env(shard.variant)
        inference = 0.0

        def act(_: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
            nonlocal inference
            tick = time.perf_counter()
            actions = self.policy.predict_chunk(obs)[:, 0]
            inference += time.perf_counter() - tick
            return actions

        before = dict(env.timings)
        records = play_episodes(
            env, act, shard.seeds, record=len(shard.seeds) if shard.record else 0
        )
        timings = {k: env.timings[k] - before.get(k, 0.0) for k in env.timings}
        timings["inference"] = inference
        radius = self.scene.task(shard.variant).success.radius
        return ShardOutcome(
            shard=shard,
            episodes=[
                EpisodeOutcome(
                    shard.variant,
                    shard.start + r.index,
                    r.seed,
                    r.success,
                    r.length,
                    r.episode_return,
                    r.instruction,
                    closest_target_distance=r.closest_target_distance,
                    closest_distractor_distance=r.closest_distractor_distance,
                    final_target_distance=r.final_target_distance,
                    failure=failure_mode(
                        r.success, r.closest_target_distance, r.closest_distractor_distance, radius
                    ),
                )
                for r in records
            ],
            frames={shard.start + r.index: np.stack(r.frames) for r in records if r.frames},
            timings=timings,
            pid=os.getpid(),
            node=node_id(),
        )

    def close(self) -> None:
        """Release the simulators (renderers hold GL contexts)."""
        for env in self.envs.values():
            env.close()
        self.envs.clear()


def check_policy_fits(policy_path: str | Path, robot: str) -> None:
    """Refuse, before any work, a policy whose observation or action spec does not match."""
    policy = load_acting_policy(policy_path)
    spec = get_robot(robot)
    known = [c.name for c in spec.cameras]
    problems = []
    if policy.action_dim != spec.action.dim:
        problems.append(f"action_dim {policy.action_dim} != robot's {spec.action.dim}")
    if policy.state_dim != len(spec.state_names):
        problems.append(f"state_dim {policy.state_dim} != robot's {len(spec.state_names)}")
    missing = [c for c in policy.cameras if c not in known]
    if missing:
        problems.append(f"cameras {missing} not on the robot (it has {', '.join(known)})")
    if problems:
        raise PolicySpecError(f"{policy_path}: does not fit robot {robot!r}: {'; '.join(problems)}")


def run_suite(
    policy_path: str | Path,
    robot: str,
    scene: SceneConfig,
    sim: SimConfig,
    config: EvalConfig,
    seed: int,
    ray_address: str | None = None,
    on_shard: Callable[[ShardOutcome], None] | None = None,
    on_status: StatusFn | None = None,
) -> tuple[list[ShardOutcome], dict[str, Any]]:
    """Evaluate every (variant, seed) of the suite once; returns the shard outcomes (in plan
    order) and run facts (wall time, workers, replacements: workers restarted). ``on_status``
    gets a line for each worker that died and was restarted (which shard it played again).

    Raises:
        SceneError / PolicySpecError: an empty suite, unknown variants, a policy that does not
            fit the robot -- all before any episode runs.
        WorkersDiedError: a worker died more than ``config.max_worker_restarts`` times.
    """
    variants = suite_variants(scene, config)
    seeds = episode_seeds(seed, config.episodes, "eval")
    if not seeds:
        raise SceneError("the evaluation suite has no episodes")
    check_policy_fits(policy_path, robot)
    shards = plan_shards(variants, seeds, config.episodes_per_shard)
    num_envs = min(config.envs_per_worker, config.episodes_per_shard, len(seeds))
    args = (str(policy_path), robot, scene.model_dump(), sim.model_dump(), num_envs)
    start = time.perf_counter()
    if config.workers == 0:
        worker = EvalWorker(*args, threads=sim.num_threads)
        outcomes = {}
        try:
            worker.warm(variants)
            startup = time.perf_counter() - start
            for shard in shards:
                outcomes[(shard.variant, shard.start)] = result = worker.run(shard)
                if on_shard:
                    on_shard(result)
        finally:
            worker.close()
        replacements = 0
    else:
        outcomes, replacements, startup = _run_on_ray(
            shards, variants, args, config, ray_address, on_shard, on_status
        )
    facts = {
        "wall_s": time.perf_counter() - start,
        "startup_s": startup,
        "workers": config.workers,
        "replacements": replacements,
        "variants": variants,
        "seeds": seeds,
    }
    return [outcomes[(s.variant, s.start)] for s in shards], facts


def _run_on_ray(
    shards: list[Shard],
    variants: list[str],
    args: tuple[str, str, dict[str, Any], dict[str, Any], int],
    config: EvalConfig,
    ray_address: str | None,
    on_shard: Callable[[ShardOutcome], None] | None,
    on_status: StatusFn | None,
) -> tuple[dict[tuple[str, int], ShardOutcome], int, float]:
    from stages.ray_runtime import init_ray
    from stages.worker_pool import WorkerPool, restartable

    init_ray(ray_address)  # before importing ray (see stages/ray_runtime.py)
    remote_worker = restartable(EvalWorker, 1, config.max_worker_restarts)
    start = time.perf_counter()
    pool = WorkerPool(
        lambda _: remote_worker.remote(*args),
        min(config.workers, len(shards)),
        "evaluate worker",
        "evaluate.max_worker_restarts",
        config.max_worker_restarts,
        on_status,
    )
    outcomes: dict[tuple[str, int], ShardOutcome] = {}
    try:
        # A worker restarted later warms up on its first shard.
        pool.gather(pool.call_each(lambda w: w.warm.remote(variants)), "its warm-up")
        startup = time.perf_counter() - start
        for shard, result in pool.map_unordered(
            shards,
            lambda w, shard: w.run.remote(shard),
            lambda shard: (
                f"{shard.variant} episodes {shard.start}-{shard.start + len(shard.seeds)}"
            ),
        ):
            outcomes[(shard.variant, shard.start)] = result
            if on_shard:
                on_shard(result)
    finally:
        pool.close()
    return outcomes, pool.restarts, startup
