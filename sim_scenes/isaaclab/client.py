"""The Isaac Lab backend behind :class:`~sim_scenes.batched_env.BatchedEnv` (``sim.backend:
isaaclab``).

Isaac Lab needs Python 3.12 and its own torch, so it cannot load into robo-pipe's environment.
:class:`IsaacLabBatchedEnv` starts :mod:`sim_scenes.isaaclab.worker` in the Isaac Lab
environment (``make isaaclab-env``) and forwards every call over a socket pair
(:mod:`sim_scenes.worker_protocol`). Callers see the same interface, units and seeds as the
MuJoCo backend; the episode bookkeeping (lengths, returns, which episodes ended) is kept here.

The worker's own output (Isaac Lab's and Warp's logs) goes to a log file whose tail is quoted
when the worker fails. The worker exits when this side closes, and also when this process dies
(it reads end-of-file on the socket).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

import numpy as np

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation, EpisodeSummary, StepResult
from sim_scenes.config import SimConfig
from sim_scenes.isaaclab.env import isaaclab_python
from sim_scenes.tasks import TaskVariant
from sim_scenes.touch import Phrasing, SceneError, SceneVariant, touch_variant
from sim_scenes.worker_process import WorkerError, WorkerProcess

START_TIMEOUT_S = 600.0
"""Seconds to wait for the worker's env: the first start on a machine compiles Warp's kernels
(~2 min on 2 cores, cached in ``~/.cache/warp`` afterwards); later starts take ~10 s."""


class IsaacLabWorkerError(WorkerError):
    """The Isaac Lab worker failed; the message carries its traceback and log tail."""


class IsaacLabBatchedEnv(BatchedEnv):
    """The touch task on Isaac Lab 3 (Newton physics), N environments in a worker process.
    Arguments as :class:`BatchedEnv`'s, plus:

    Args:
        device: where Isaac Lab simulates and renders: ``cpu`` or ``cuda:K``.
    """

    def __init__(
        self,
        robot: RobotSpec,
        variant: TaskVariant,
        num_envs: int,
        cameras: Sequence[str] = ("scene",),
        image_size: int = 64,
        device: str = "cpu",
        autoreset: bool = True,
        retarget: int = 0,
        phrasing: Phrasing = "trained",
    ) -> None:
        super().__init__(
            robot, variant, num_envs, cameras, image_size, autoreset, retarget, phrasing
        )
        self.variant: SceneVariant = touch_variant(variant)
        python = isaaclab_python()
        # timings["simulate"] counts the worker's physics and rendering together: Isaac Lab
        # renders inside its step, so "render" stays 0 on this backend.
        self.start_seconds = 0.0
        """Seconds the worker took to build the env (Warp kernels, USD, Newton model)."""
        self._steps = np.zeros(num_envs, np.int64)
        self._return = np.zeros(num_envs, np.float32)
        self._seeds = np.zeros(num_envs, np.int64)

        self._worker = WorkerProcess(
            python, "sim_scenes.isaaclab.worker", "Isaac Lab worker", IsaacLabWorkerError
        )
        try:
            ready = self._request(
                "init",
                "ready",
                timeout=START_TIMEOUT_S,
                robot=robot.name,
                variant=self.variant.name,
                success_radius=self.variant.success.radius,
                hold_steps=self.variant.success.hold_steps,
                episode_steps=self.variant.episode_steps,
                reward=asdict(self.variant.reward),
                num_envs=num_envs,
                cameras=list(self.cameras),
                image_size=image_size,
                device=device,
                retarget=retarget,
                phrasing=phrasing,
                autoreset=autoreset,
            )
            self.start_seconds = float(ready["seconds"])
        except BaseException:
            self.close()
            raise

    @classmethod
    def sim_options(cls, sim: SimConfig) -> dict[str, Any]:
        return {"device": sim.device}

    @classmethod
    def simulator_version(cls, sim: SimConfig) -> str:
        return f"isaaclab:{isaaclab_python().parent.parent}"  # its folder names the release

    @classmethod
    def check_available(cls, sim: SimConfig) -> None:
        """Its own environment is there (:class:`~sim_scenes.isaaclab.env.IsaacLabMissingError`
        says how to create it)."""
        isaaclab_python()

    def _request(
        self, op: str, expect: str, timeout: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Send ``op`` and wait (up to ``timeout`` s, or for ever) for the ``expect`` reply."""
        if self._worker.closed:
            raise SceneError("the Isaac Lab env is closed")
        return self._worker.request(op, expect, timeout, **fields)

    # -- BatchedEnv --------------------------------------------------------------------------

    def _observation(self, fields: dict[str, Any]) -> BatchedObservation:
        return BatchedObservation(
            images={c: fields[f"image:{c}"] for c in self.cameras},
            state=fields["state"],
            instruction=list(fields["instructions"]),
        )

    def reset_envs(self, env_ids: Sequence[int], seeds: Sequence[int]) -> BatchedObservation:
        if len(env_ids) != len(seeds):
            raise SceneError(f"reset_envs got {len(env_ids)} env ids but {len(seeds)} seeds")
        ids = np.asarray(env_ids, np.int64)
        tick = time.perf_counter()
        fields = self._request("reset", "obs", env_ids=ids, seeds=np.asarray(seeds, np.int64))
        self.timings["simulate"] += time.perf_counter() - tick
        self._steps[ids], self._return[ids] = 0, 0.0
        self._seeds[:] = fields["seeds"]
        return self._observation(fields)

    def step(self, actions: np.ndarray) -> StepResult:
        actions = np.asarray(actions, dtype=np.float32)
        if actions.shape != (self.num_envs, self.robot.action.dim):
            raise SceneError(
                f"actions must have shape ({self.num_envs}, {self.robot.action.dim}), "
                f"got {actions.shape}"
            )
        tick = time.perf_counter()
        fields = self._request("step", "obs", actions=actions)
        self.timings["simulate"] += time.perf_counter() - tick
        terminated, truncated = fields["terminated"], fields["truncated"]
        self._steps += 1
        self._return += fields["reward"]
        done = np.flatnonzero(terminated | truncated)
        final = EpisodeSummary(
            env_ids=done,
            seeds=self._seeds[done].copy(),
            success=fields["success"][done],
            length=self._steps[done].copy(),
            episode_return=self._return[done].copy(),
        )
        if self.autoreset:
            self._steps[done], self._return[done] = 0, 0.0
        self._seeds[:] = fields["seeds"]
        return StepResult(
            obs=self._observation(fields),
            reward=fields["reward"],
            terminated=terminated,
            truncated=truncated,
            success=fields["success"],
            final=final,
            info={
                "tcp_target_distance": fields["distance"],
                "tcp_target_distance_before": fields["distance_before"],
                "tcp_distractor_distance": fields["distractor"],
            },
        )

    def privileged(self) -> dict[str, np.ndarray]:
        return self._request("privileged", "privileged")

    def close(self) -> None:
        self._worker.close()

    def __del__(self) -> None:
        if getattr(self, "_worker", None) is not None and not self._worker.closed:
            self.close()
