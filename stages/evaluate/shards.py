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
(receding horizon); with an inference delay, a policy plays the delayed rules of
:mod:`stages.evaluate.delay` instead. Nothing here assumes MuJoCo: environments come from
``make_env``.
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
from sim_scenes.errors import SceneError
from sim_scenes.seeds import episode_seeds
from sim_scenes.tasks import resolve_task, task_name
from sim_scenes.touch import Phrasing
from stages.evaluate.config import EvalConfig
from stages.evaluate.delay import DelayedActor, DelayPlan, check_plan
from stages.evaluate.policies import ActingPolicy, PolicySpecError, load_acting_policy
from stages.ray_runtime import node_id
from stages.worker_pool import PoolWorker, Ready


@dataclass(frozen=True)
class Shard:
    """A run of consecutive seeds of one variant, for one of the workers' policies."""

    variant: str
    start: int
    """Index of the first seed in the variant's seed list."""
    seeds: list[int]
    record: bool
    """Keep every episode's frames (to pick the recorded successes and failures from)."""
    policy: int = 0
    """Which of the workers' policies plays it (0: the candidate, 1: the baseline)."""


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
    signals: dict[str, float] = field(default_factory=dict)
    """What its task family records of an episode, by name (touch: ``closest_target``,
    ``closest_distractor``, ``final_target``, m); one the backend does not report is absent."""
    failure: str = ""
    """Why it failed (one of its task family's ``failure_modes``); ``""`` if solved."""


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
    """The suite's variants: configured, or the task family's suite for the trained variant
    (touch: the variants held out for it, else itself)."""
    if config.variants:
        return list(config.variants)
    family, name = resolve_task(scene.variant)
    return [task_name(family, variant) for variant in family.eval_variants(name)]


def plan_shards(
    variants: list[str],
    seeds: list[int],
    per_shard: int,
    indices: range | None = None,
    policy: int = 0,
    record: bool = True,
) -> list[Shard]:
    """Every (variant, seed) of ``indices`` (default: all of ``seeds``) exactly once, in
    shards of up to ``per_shard``, for ``policy``; with ``record``, the candidate's (policy 0)
    shard of each variant from seed 0 is the recorded one."""
    indices = indices if indices is not None else range(len(seeds))
    record = record and policy == 0  # frame strips show the candidate
    return [
        Shard(v, start, seeds[start:end], record and start == 0, policy)
        for v in variants
        for start in range(indices.start, indices.stop, per_shard)
        for end in [min(start + per_shard, indices.stop)]
    ]


class EvalWorker(PoolWorker):
    """Policy copies (the candidate and, in a comparison, the baseline) plus one batched
    environment per variant and camera setup (a Ray actor, or in-process), whose
    instructions are worded in ``phrasing`` (``evaluate.phrasing``)."""

    def __init__(
        self,
        policy_paths: list[str],
        robot: str,
        scene: SceneConfig,
        sim: SimConfig,
        num_envs: int,
        threads: int = 1,
        delays: list[DelayPlan | None] | None = None,
        phrasing: Phrasing = "trained",
    ) -> None:
        loaded: dict[str, ActingPolicy] = {}  # a path listed twice (a delay sweep): loaded once
        for path in policy_paths:
            if str(path) not in loaded:
                loaded[str(path)] = load_acting_policy(path, threads)
        self.policies = [loaded[str(path)] for path in policy_paths]
        self.delays = delays or [None] * len(policy_paths)
        """Per policy: the inference delay it plays (None: none, receding horizon)."""
        self.robot = get_robot(robot)
        self.scene = scene
        self.sim = sim.model_copy(update={"num_threads": threads})
        self.num_envs = num_envs
        self.phrasing = phrasing
        self.envs: dict[tuple[str, tuple[str, ...], int], BatchedEnv] = {}

    def _env(self, policy: int, variant: str) -> BatchedEnv:
        """The variant's simulator rendering what ``policy`` sees (shared by policies that see
        the same cameras at the same size)."""
        cameras, size = tuple(self.policies[policy].cameras), self.policies[policy].image_size
        key = (variant, cameras, size)
        if key not in self.envs:
            self.envs[key] = make_env(
                self.robot,
                self.scene.model_copy(
                    update={"variant": variant, "cameras": list(cameras), "image_size": size}
                ),
                self.sim,
                num_envs=self.num_envs,
                autoreset=False,
                phrasing=self.phrasing,
            )
        return self.envs[key]

    def warm(self, variants: list[str]) -> Ready:
        """Build every variant's simulators and run each policy once, so start-up is not timed
        as evaluation."""
        for policy, acting in enumerate(self.policies):
            for variant in variants:
                env = self._env(policy, variant)
                acting.predict_chunk(env.reset([0] * env.num_envs))
        return Ready(os.getpid())

    def run(self, shard: Shard) -> ShardOutcome:
        """Play the shard's episodes."""
        env = self._env(shard.policy, shard.variant)
        policy = self.policies[shard.policy]
        delay = self.delays[shard.policy]
        inference = 0.0

        def act(_: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
            nonlocal inference
            tick = time.perf_counter()
            actions = policy.predict_chunk(obs)[:, 0]
            inference += time.perf_counter() - tick
            return actions

        delayed = DelayedActor(policy, delay, self.robot) if delay is not None else None
        before = dict(env.timings)
        family, task = resolve_task(shard.variant)[0], self.scene.task(shard.variant)
        records = play_episodes(
            env,
            delayed.act if delayed else act,
            shard.seeds,
            record=len(shard.seeds) if shard.record else 0,
            on_step=delayed.on_step if delayed else None,
            signals=family.episode_signals,
        )
        timings = {k: env.timings[k] - before.get(k, 0.0) for k in env.timings}
        timings["inference"] = delayed.inference_s if delayed else inference
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
                    signals=r.signals,
                    failure=family.failure_mode(r.success, r.signals, task),
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


def check_policy_fits(policy_path: str | Path, robot: str) -> ActingPolicy:
    """Refuse, before any work, a policy made for another robot, or whose observation or action
    spec does not match; returns the policy loaded."""
    policy = load_acting_policy(policy_path)
    if policy.robot != robot:
        raise PolicySpecError(
            f"{policy_path}: a policy for robot {policy.robot!r} cannot act for robot {robot!r} "
            "(the task's)"
        )
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
    return policy


class Suite:
    """Workers holding the policies of one evaluation, kept for as many :meth:`play` calls as
    it takes (a sequential comparison plays a batch per look): started on entering, closed on
    leaving. ``policies[0]`` is the candidate; shards name the policy they are for.

    ``delays[i]`` is the inference delay ``policies[i]`` plays (None or absent: none).

    Raises (when made, before any worker starts):
        SceneError / PolicySpecError: unknown variants, a policy that does not fit the robot.
        DelayError: a delay the policy cannot play (:func:`stages.evaluate.delay.check_plan`).
    """

    def __init__(
        self,
        policies: list[str | Path],
        robot: str,
        scene: SceneConfig,
        sim: SimConfig,
        config: EvalConfig,
        ray_address: str | None = None,
        on_shard: Callable[[ShardOutcome], None] | None = None,
        on_status: StatusFn | None = None,
        delays: list[DelayPlan | None] | None = None,
    ) -> None:
        self.variants = suite_variants(scene, config)
        most = (
            len(policies)
            * len(self.variants)
            * math.ceil(config.episodes / config.episodes_per_shard)
        )
        self.workers = min(config.workers, most)  # never more workers than shards
        plans = list(delays or []) + [None] * (len(policies) - len(delays or []))
        fits: dict[str, ActingPolicy] = {}
        for i, path in enumerate(policies):
            if str(path) not in fits:
                fits[str(path)] = check_policy_fits(path, robot)
            acting = fits[str(path)]
            if (plan := plans[i]) is not None:
                plans[i] = check_plan(plan, acting, str(path))
        self.delays = plans
        num_envs = min(config.envs_per_worker, config.episodes_per_shard, config.episodes)
        self.args = ([str(p) for p in policies], robot, scene, sim, num_envs)
        self.config, self.ray_address, self.sim = config, ray_address, sim
        self.on_shard, self.on_status = on_shard, on_status
        self.startup_s = 0.0
        self.start = time.perf_counter()
        self._local: EvalWorker | None = None
        self._pool: Any = None

    def __enter__(self) -> Suite:
        self.start = time.perf_counter()
        if self.workers == 0:
            self._local = EvalWorker(
                *self.args, self.sim.num_threads, self.delays, self.config.phrasing
            )
            self._local.warm(self.variants)
        else:
            from stages.ray_runtime import init_ray
            from stages.worker_pool import WorkerPool, restartable

            init_ray(self.ray_address)  # before importing ray (see stages/ray_runtime.py)
            remote_worker = restartable(EvalWorker, 1, self.config.max_worker_restarts)
            self._pool = WorkerPool(
                lambda _: remote_worker.remote(*self.args, 1, self.delays, self.config.phrasing),
                self.workers,
                "evaluate worker",
                "evaluate.max_worker_restarts",
                self.config.max_worker_restarts,
                self.on_status,
            )
            # A worker restarted later warms up on its first shard.
            self._pool.gather(
                self._pool.call_each(lambda w: w.warm.remote(self.variants)), "its warm-up"
            )
        self.startup_s = time.perf_counter() - self.start
        return self

    def __exit__(self, *_: object) -> None:
        if self._local is not None:
            self._local.close()
        if self._pool is not None:
            self._pool.close()

    @property
    def replacements(self) -> int:
        """Workers Ray restarted so far."""
        return self._pool.restarts if self._pool is not None else 0

    def play(self, shards: list[Shard]) -> list[ShardOutcome]:
        """Play every shard once; outcomes in the order of ``shards``."""
        outcomes: dict[int, ShardOutcome] = {}
        if self._local is not None:
            for i, shard in enumerate(shards):
                outcomes[i] = result = self._local.run(shard)
                if self.on_shard:
                    self.on_shard(result)
        else:
            numbered = list(enumerate(shards))
            for (i, _), result in self._pool.map_unordered(
                numbered,
                lambda w, item: w.run.remote(item[1]),
                lambda item: (
                    f"{item[1].variant} episodes {item[1].start}-"
                    f"{item[1].start + len(item[1].seeds)}"
                ),
            ):
                outcomes[i] = result
                if self.on_shard:
                    self.on_shard(result)
        return [outcomes[i] for i in range(len(shards))]

    def facts(self, seeds: list[int]) -> dict[str, Any]:
        """What the report says of this run: wall and start-up time, workers, restarts, the
        variants, the instructions' phrasing and the ``seeds`` played."""
        return {
            "wall_s": time.perf_counter() - self.start,
            "startup_s": self.startup_s,
            "workers": self.config.workers,
            "replacements": self.replacements,
            "variants": self.variants,
            "phrasing": self.config.phrasing,
            "seeds": seeds,
        }


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
    seeds = episode_seeds(seed, config.episodes, "eval")
    if not seeds:
        raise SceneError("the evaluation suite has no episodes")
    with Suite([policy_path], robot, scene, sim, config, ray_address, on_shard, on_status) as suite:
        shards = plan_shards(suite.variants, seeds, config.episodes_per_shard)
        return suite.play(shards), suite.facts(seeds)
