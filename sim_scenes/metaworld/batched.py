"""The Meta-World backend behind :class:`~sim_scenes.batched_env.BatchedEnv` (``sim.backend:
metaworld``).

Meta-World pins an older MuJoCo than robo-pipe's, so it never loads into this process:
:class:`MetaWorldBatchedEnv` starts ``sim.num_threads`` workers
(:mod:`sim_scenes.metaworld.worker`) in the Meta-World environment (``make metaworld-env``),
each stepping its share of the N environments, and forwards every call over socket pairs
(:mod:`sim_scenes.worker_protocol`): it sends each worker its request before waiting for any
reply, so the workers step at once. Callers see the interface, seeds and same-step autoreset of
every backend; the episode bookkeeping (lengths, returns, caps, the next seeds) is kept here.

Actions are Meta-World's 4-D ones (:data:`robots.sawyer.SAWYER`): hand displacement (x, y, z;
1 unit = 1 cm) and gripper effort, each clipped to [-1, 1] by Meta-World; state is the hand's
position (m) and the gripper's opening (0..1).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation, EpisodeSummary, StepResult
from sim_scenes.config import SimConfig
from sim_scenes.metaworld.env import metaworld_python
from sim_scenes.metaworld.tasks import GOAL_IS_TARGET, MetaWorldVariant
from sim_scenes.seeds import next_episode_seed
from sim_scenes.touch import Phrasing, SceneError
from sim_scenes.worker_process import WorkerError, WorkerProcess

START_TIMEOUT_S = 120.0
"""Seconds to wait for a worker to start (~1 s; a busy machine's first import is slower)."""
CALL_TIMEOUT_S = 120.0
"""Seconds to wait for one reply (a reset that builds a task's env takes ~1 s)."""
OBJECT, GOAL = slice(4, 7), slice(36, 39)
"""Where Meta-World's observation holds the task's object and its goal (m, world frame)."""


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.sqrt(np.square(a - b).sum(axis=1)).astype(np.float32)


class MetaWorldWorkerError(WorkerError):
    """A Meta-World worker failed; the message carries its traceback and log tail."""


class MetaWorldBatchedEnv(BatchedEnv):
    """N environments of a Meta-World variant in worker processes. Arguments as
    :class:`BatchedEnv`'s (``retarget`` must be 0: a Meta-World scene has one task), plus:

    Args:
        workers: worker processes (at most ``num_envs``); each steps its envs in turn.

    Raises:
        MetaWorldMissingError: no Meta-World environment (before any process starts).
        WorkerRefusal: a camera Meta-World's scene does not have.
    """

    def __init__(
        self,
        robot: RobotSpec,
        variant: MetaWorldVariant,
        num_envs: int,
        cameras: Sequence[str] = ("corner2",),
        image_size: int = 64,
        workers: int = 1,
        autoreset: bool = True,
        retarget: int = 0,
        phrasing: Phrasing = "trained",
    ) -> None:
        super().__init__(
            robot, variant, num_envs, cameras, image_size, autoreset, retarget, phrasing
        )
        if not isinstance(variant, MetaWorldVariant):
            raise SceneError(f"the metaworld backend plays Meta-World tasks, not {variant.name!r}")
        if retarget:
            raise SceneError("a Meta-World scene has one task: retarget must be 0")
        if phrasing not in ("trained", "unseen"):
            raise SceneError(f"Meta-World's instructions are trained or unseen, not {phrasing!r}")
        python = metaworld_python()
        self.variant: MetaWorldVariant = variant
        # Contiguous shares: worker w steps envs bounds[w]..bounds[w + 1] - 1, as its slots.
        count = max(1, min(workers, num_envs))
        self._bounds = np.linspace(0, num_envs, count + 1).round().astype(int)
        self._seeds = np.zeros(num_envs, np.int64)
        self._reset_seeds = np.zeros(num_envs, np.int64)
        self._episode_count = np.zeros(num_envs, np.int64)
        self._steps = np.zeros(num_envs, np.int64)
        self._return = np.zeros(num_envs, np.float32)
        self._cap = np.full(num_envs, variant.episode_steps, np.int64)
        self._instructions = [""] * num_envs
        self._about_goal = np.zeros(num_envs, bool)
        """Each env's episode is about a point (:data:`GOAL_IS_TARGET`), set as it starts."""
        self._observation = np.zeros((num_envs, 39), np.float32)
        self._goal_distance = np.zeros(num_envs, np.float32)
        """m, each env's distance the task must close (:meth:`_distances`), at its last step."""
        self._workers: list[WorkerProcess] = []
        self._last: dict[WorkerProcess, dict[str, Any]] = {}
        try:
            for _ in range(count):
                self._workers.append(
                    WorkerProcess(
                        python,
                        "sim_scenes.metaworld.worker",
                        "Meta-World worker",
                        MetaWorldWorkerError,
                    )
                )
            replies = self._all(
                "init",
                "ready",
                START_TIMEOUT_S,
                [
                    {"cameras": list(self.cameras), "image_size": image_size, "slots": int(n)}
                    for n in np.diff(self._bounds)
                ],
            )
        except BaseException:
            self.close()
            raise
        self.camera_fovy: dict[str, float] = dict(replies[0]["camera_fovy"])
        """Every camera of Meta-World's scene and its vertical field of view, degrees."""
        self.control_period_s = math.nan
        """The last reset task's control period, s (its ``dt``: frame_skip x timestep)."""
        self.action_scale = math.nan
        """The last reset task's hand displacement per action unit, m."""

    @classmethod
    def sim_options(cls, sim: SimConfig) -> dict[str, Any]:
        return {"workers": sim.num_threads}

    @classmethod
    def simulator_version(cls, sim: SimConfig) -> str:
        return f"metaworld:{metaworld_python().parent.parent}"  # its folder names the release

    @classmethod
    def check_available(cls, sim: SimConfig) -> None:
        """Its own environment is there (:class:`~sim_scenes.metaworld.env.MetaWorldMissingError`
        says how to create it)."""
        metaworld_python()

    def _all(
        self, op: str, expect: str, timeout: float, fields: list[dict[str, Any] | None]
    ) -> list[dict[str, Any]]:
        """``op`` to every worker with fields (``None``: leave that one out) at once, then their
        replies; a worker left out contributes its last reply (its envs' observations)."""
        if not self._workers or self._workers[0].closed:
            raise SceneError("the Meta-World env is closed")
        asked = [(w, own) for w, own in zip(self._workers, fields, strict=True) if own is not None]
        for worker, own in asked:
            worker.submit(op, **own)
        for worker, _ in asked:
            self._last[worker] = worker.reply(expect, timeout)
        return [self._last[worker] for worker in self._workers]

    def _gather(self, replies: list[dict[str, Any]], key: str) -> np.ndarray:
        return np.concatenate([reply[key] for reply in replies])

    def _observe(self, replies: list[dict[str, Any]]) -> BatchedObservation:
        self._observation = self._gather(replies, "observation")
        return BatchedObservation(
            images={c: self._gather(replies, f"image:{c}") for c in self.cameras},
            state=self._gather(replies, "state"),
            instruction=list(self._instructions),
        )

    # -- BatchedEnv --------------------------------------------------------------------------

    def reset_envs(self, env_ids: Sequence[int], seeds: Sequence[int]) -> BatchedObservation:
        if len(env_ids) != len(seeds):
            raise SceneError(f"reset_envs got {len(env_ids)} env ids but {len(seeds)} seeds")
        ids = np.asarray(env_ids, np.int64)
        self._reset_seeds[ids] = np.asarray(seeds, np.int64)
        self._episode_count[ids] = 0
        return self._start(ids, np.asarray(seeds, np.int64))

    def _start(self, ids: np.ndarray, seeds: np.ndarray) -> BatchedObservation:
        """New episodes in envs ``ids`` (their seeds ``seeds``); every env's observation."""
        tick = time.perf_counter()
        requests = []
        for start, stop in zip(self._bounds[:-1], self._bounds[1:], strict=True):
            mine = (ids >= start) & (ids < stop)
            tasks = [self.variant.episode_task(int(s)) for s in seeds[mine]]
            own = {"slots": ids[mine] - start, "tasks": tasks, "seeds": seeds[mine]}
            requests.append(own if mine.any() else None)
        replies = self._all("reset", "obs", CALL_TIMEOUT_S, requests)
        for env, seed in zip(ids, seeds, strict=True):
            self._seeds[env] = seed
            self._instructions[env] = self.variant.instruction(int(seed), self.phrasing)
            self._about_goal[env] = self.variant.episode_task(int(seed)) in GOAL_IS_TARGET
        self._steps[ids], self._return[ids] = 0, 0.0
        own_caps = self._gather(replies, "max_steps")
        self._cap[ids] = np.minimum(own_caps[ids], self.variant.episode_steps)
        last = self._last[self._workers[int(np.searchsorted(self._bounds, ids[-1], "right")) - 1]]
        self.control_period_s = float(last["control_period_s"])
        self.action_scale = float(last["action_scale"])
        self.timings["simulate"] += time.perf_counter() - tick
        obs = self._observe(replies)
        self._goal_distance[ids] = self._distances()[1][ids]
        return obs

    def _distances(self) -> tuple[np.ndarray, np.ndarray]:
        """m, (N,) each: the hand to the task's object, and what must arrive at the goal (the
        object, or the hand itself in a task about a point) to it."""
        truth = self.privileged()
        mover = np.where(self._about_goal[:, None], truth["tcp_pos"], truth["target_pos"])
        return (
            _distance(truth["tcp_pos"], truth["target_pos"]),
            _distance(mover, truth["goal_pos"]),
        )

    def step(self, actions: np.ndarray) -> StepResult:
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (self.num_envs, self.robot.action.dim):
            raise SceneError(
                f"actions must have shape ({self.num_envs}, {self.robot.action.dim}), "
                f"got {actions.shape}"
            )
        if self._steps.max() >= self._cap.min():
            over = np.flatnonzero(self._steps >= self._cap)
            raise SceneError(f"envs {over.tolist()} ended their episodes; reset them first")
        tick = time.perf_counter()
        bounds = zip(self._bounds[:-1], self._bounds[1:], strict=True)
        replies = self._all(
            "step", "obs", CALL_TIMEOUT_S, [{"actions": actions[a:b]} for a, b in bounds]
        )
        self.timings["simulate"] += time.perf_counter() - tick
        obs = self._observe(replies)
        reward, success = self._gather(replies, "reward"), self._gather(replies, "success")
        reach, to_goal = self._distances()  # before an autoreset starts new episodes
        info = {"hand_target_distance": reach, "target_goal_distance": to_goal}
        if self.variant.reward is not None:  # a config's terms instead of Meta-World's own
            reward = self.variant.reward(success, to_goal, self._goal_distance)
        self._goal_distance = to_goal.copy()  # an autoreset below writes its new episodes in
        self._steps += 1
        self._return += reward
        terminated = success.copy()
        truncated = ~terminated & (self._steps >= self._cap)
        done = np.flatnonzero(terminated | truncated)
        final = EpisodeSummary(
            env_ids=done,
            seeds=self._seeds[done].copy(),
            success=success[done],
            length=self._steps[done].copy(),
            episode_return=self._return[done].copy(),
        )
        if self.autoreset and len(done):
            self._episode_count[done] += 1
            seeds = np.array(
                [
                    next_episode_seed(int(self._reset_seeds[e]), int(self._episode_count[e]))
                    for e in done
                ],
                np.int64,
            )
            obs = self._start(done, seeds)
        return StepResult(
            obs=obs,
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            final=final,
            info=info,
        )

    def privileged(self) -> dict[str, np.ndarray]:
        """``tcp_pos`` (the hand), ``target_pos`` (the task's object; reach: its goal point) and
        ``goal_pos``, (N, 3) m, and Meta-World's whole ``observation`` (N, 39)."""
        obs = self._observation
        target = np.where(self._about_goal[:, None], obs[:, GOAL], obs[:, OBJECT])
        return {
            "tcp_pos": obs[:, :3].copy(),
            "target_pos": target,
            "goal_pos": obs[:, GOAL].copy(),
            "observation": obs.copy(),
        }

    def expert_actions(self) -> np.ndarray:
        """Each env's task's scripted expert (``metaworld.policies``) on its current
        observation: float32 ``(N, 4)`` in [-1, 1]."""
        replies = self._all("expert", "action", CALL_TIMEOUT_S, [{} for _ in self._workers])
        return self._gather(replies, "actions")

    def close(self) -> None:
        for worker in self._workers:
            worker.close()

    def __del__(self) -> None:
        if any(not w.closed for w in getattr(self, "_workers", [])):
            self.close()
