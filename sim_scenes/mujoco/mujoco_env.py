"""Batched MuJoCo backend: N touch-task environments stepped by ``mujoco.rollout`` threads.

Each step is one native call: the actions become joint position targets, ``mujoco.rollout``
advances every environment ``robot.substeps`` physics steps on a persistent thread pool, and the
last state and tcp sensor reading of each environment are kept. Python only touches whole
arrays per control step, except for rendering, which draws one frame per environment and camera.

Every environment owns a copy of the compiled scene so that colours, lights and the camera can
differ between environments while the batched rollout still sees models of one size signature.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Sequence
from typing import Any

import mujoco
import numpy as np
from mujoco import rollout

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation, EpisodeSummary, StepResult
from sim_scenes.config import SimConfig
from sim_scenes.mujoco.rendering import BatchedRenderer
from sim_scenes.mujoco.touch_scene import (
    MAX_OBJECTS,
    SceneIndex,
    apply_layout,
    build_scene,
    index_scene,
)
from sim_scenes.seeds import next_episode_seed
from sim_scenes.tasks import TaskVariant
from sim_scenes.touch import (
    EpisodeLayout,
    Phrasing,
    SceneError,
    SceneVariant,
    sample_layout,
    touch_variant,
)

_STATE_SPEC = mujoco.mjtState.mjSTATE_FULLPHYSICS


class MujocoBatchedEnv(BatchedEnv):
    """The touch task on MuJoCo, N environments at once. Arguments as :class:`BatchedEnv`'s,
    plus:

    Args:
        num_threads: rollout and render threads (>= 1).
    """

    def __init__(
        self,
        robot: RobotSpec,
        variant: TaskVariant,
        num_envs: int,
        cameras: Sequence[str] = ("scene",),
        image_size: int = 64,
        num_threads: int = 2,
        autoreset: bool = True,
        retarget: int = 0,
        phrasing: Phrasing = "trained",
    ) -> None:
        super().__init__(
            robot, variant, num_envs, cameras, image_size, autoreset, retarget, phrasing
        )
        self.variant: SceneVariant = touch_variant(variant)
        if num_threads < 1:
            raise SceneError(f"num_threads must be >= 1, got {num_threads}")

        self._nominal = build_scene(robot, image_size)
        self._index = index_scene(self._nominal, robot)
        self._models = [copy.copy(self._nominal) for _ in range(num_envs)]
        self._scratch = mujoco.MjData(self._nominal)
        self._thread_data = [mujoco.MjData(self._nominal) for _ in range(num_threads)]
        self._pool = rollout.Rollout(nthread=num_threads)
        self._nstate = mujoco.mj_stateSize(self._nominal, _STATE_SPEC)
        self._nsub = robot.substeps
        nq, nu = self._nominal.nq, self._nominal.nu
        self._state = np.zeros((num_envs, self._nstate))
        self._tcp = np.zeros((num_envs, 3))
        # Preallocated rollout buffers: (N, substeps, ·).
        self._ctrl = np.zeros((num_envs, self._nsub, nu))
        self._ctrl_row = np.zeros((num_envs, nu))
        self._state_out = np.zeros((num_envs, self._nsub, self._nstate))
        self._sensor_out = np.zeros((num_envs, self._nsub, self._nominal.nsensordata))
        self._qpos_slice = slice(1, 1 + nq)  # FULLPHYSICS state = [time, qpos, qvel, act, ...]
        self._arm_columns = self._index.arm_qpos + 1
        self._finger_columns = self._index.gripper_qpos + 1
        camera_ids = [
            mujoco.mj_name2id(self._nominal, mujoco.mjtObj.mjOBJ_CAMERA, c) for c in self.cameras
        ]
        self._renderer = (
            BatchedRenderer(self._nominal, image_size, camera_ids, num_threads)
            if self.cameras
            else None
        )
        self._images = {
            c: np.zeros((num_envs, image_size, image_size, 3), np.uint8) for c in self.cameras
        }
        self._joint_low = np.array([j.low for j in robot.arm])
        self._joint_high = np.array([j.high for j in robot.arm])
        self._finger_high = np.array([j.high for j in robot.gripper])
        self._max_delta = robot.authored.max_joint_delta

        self._layouts: list[EpisodeLayout | None] = [None] * num_envs
        self._seeds = np.zeros(num_envs, np.int64)
        self._reset_seeds = np.zeros(num_envs, np.int64)
        self._episode_count = np.zeros(num_envs, np.int64)
        self._target_columns = np.zeros((num_envs, 3), np.int64)  # state columns of target xyz
        # state columns of the other slots' xyz, and which of them hold an object (not parked)
        self._other_columns = np.zeros((num_envs, (MAX_OBJECTS - 1) * 3), np.int64)
        self._other_present = np.zeros((num_envs, MAX_OBJECTS - 1), bool)
        self._steps = np.zeros(num_envs, np.int64)
        self._hold = np.zeros(num_envs, np.int64)
        self._return = np.zeros(num_envs, np.float32)
        self._distance = np.zeros(num_envs, np.float64)  # tcp to target, m, before the step

    @classmethod
    def sim_options(cls, sim: SimConfig) -> dict[str, Any]:
        return {"num_threads": sim.num_threads}

    @classmethod
    def simulator_version(cls, sim: SimConfig) -> str:
        return f"mujoco=={mujoco.__version__}"

    @classmethod
    def check_available(cls, sim: SimConfig) -> None:
        """Always: MuJoCo is installed with robo-pipe."""

    # -- episode start ---------------------------------------------------------------------

    def _start_episode(self, env: int, seed: int) -> None:
        layout = sample_layout(self.variant, self.robot, seed, self.retarget, self.phrasing)
        model, data = self._models[env], self._scratch
        mujoco.mj_resetData(model, data)
        apply_layout(model, self._nominal, self._index, layout, data.qpos, self.robot)
        mujoco.mj_forward(model, data)
        mujoco.mj_getState(model, data, self._state[env], _STATE_SPEC)
        self._tcp[env] = data.site_xpos[
            mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, self.robot.authored.tcp_site)
        ]
        self._layouts[env] = layout
        self._seeds[env] = seed
        adr = self._index.object_qpos[layout.target]
        self._target_columns[env] = self._qpos_slice.start + adr + np.arange(3)
        others = [slot for slot in range(MAX_OBJECTS) if slot != layout.target]
        columns = self._index.object_qpos[others][:, None] + np.arange(3)
        self._other_columns[env] = self._qpos_slice.start + columns.reshape(-1)
        self._other_present[env] = [slot < len(layout.objects) for slot in others]
        self._distance[env] = np.linalg.norm(self._tcp[env] - data.qpos[adr : adr + 3])
        self._steps[env] = 0
        self._hold[env] = 0
        self._return[env] = 0.0

    def reset(self, seeds: Sequence[int]) -> BatchedObservation:
        if len(seeds) != self.num_envs:
            raise SceneError(f"reset needs {self.num_envs} seeds (one per env), got {len(seeds)}")
        self._episode_count[:] = 0
        self._reset_seeds[:] = seeds
        for env, seed in enumerate(seeds):
            self._start_episode(env, int(seed))
        return self._observe()

    def reset_envs(self, env_ids: Sequence[int], seeds: Sequence[int]) -> BatchedObservation:
        if len(env_ids) != len(seeds):
            raise SceneError(f"reset_envs got {len(env_ids)} env ids but {len(seeds)} seeds")
        for env, seed in zip(env_ids, seeds, strict=True):
            self._episode_count[env] = 0
            self._reset_seeds[env] = seed
            self._start_episode(int(env), int(seed))
        return self._observe(env_ids)  # the other envs' images are still current

    # -- stepping ----------------------------------------------------------------------------

    def _qpos(self) -> np.ndarray:
        return self._state[:, self._qpos_slice]

    def _target_pos(self) -> np.ndarray:
        """Centre of each environment's named object, (N, 3) m, read from the physics state."""
        return np.take_along_axis(self._state, self._target_columns, axis=1)

    def _distractor_distance(self) -> np.ndarray:
        """Tcp to the nearest object that is not the named one, (N,) m (inf: none)."""
        others = np.take_along_axis(self._state, self._other_columns, axis=1)
        gaps = np.linalg.norm(others.reshape(self.num_envs, -1, 3) - self._tcp[:, None], axis=2)
        return np.where(self._other_present, gaps, np.inf).min(axis=1)

    def step(self, actions: np.ndarray) -> StepResult:
        start = time.perf_counter()
        actions = np.asarray(actions, dtype=np.float64)
        n_arm = len(self.robot.arm)
        if actions.shape != (self.num_envs, n_arm + 1):
            raise SceneError(
                f"actions must have shape ({self.num_envs}, {n_arm + 1}), got {actions.shape}"
            )
        # np.minimum/maximum rather than np.clip: same result, a fraction of the call overhead,
        # which matters at small batch sizes where Python dominates the step.
        arm_q = self._state[:, self._arm_columns]
        delta = np.minimum(np.maximum(actions[:, :n_arm], -self._max_delta), self._max_delta)
        ctrl = self._ctrl_row
        ctrl[:, self._index.arm_actuators] = np.minimum(
            np.maximum(arm_q + delta, self._joint_low), self._joint_high
        )
        ctrl[:, self._index.gripper_actuators] = np.minimum(
            np.maximum(actions[:, n_arm:] / len(self._finger_high), 0.0), self._finger_high
        )
        self._ctrl[:] = ctrl[:, None, :]  # held for the whole control period

        self._pool.rollout(
            self._models,
            self._thread_data,
            self._state,
            self._ctrl,
            skip_checks=True,
            nstep=self._nsub,
            state=self._state_out,
            sensordata=self._sensor_out,
        )
        self._state[:] = self._state_out[:, -1]
        adr = self._index.tcp_sensor_adr
        # The sensor is computed at the start of the last substep: 1 physics step (10 ms) stale.
        self._tcp[:] = self._sensor_out[:, -1, adr : adr + 3]

        criterion, terms = self.variant.success, self.variant.reward
        distance = np.sqrt(np.square(self._tcp - self._target_pos()).sum(axis=1))
        self._hold = np.where(distance < criterion.radius, self._hold + 1, 0)
        success = self._hold >= criterion.hold_steps
        self._steps += 1
        distance_before = self._distance.copy()
        reward = terms(success, distance, distance_before)
        self._distance[:] = distance
        self._return += reward
        terminated = success.copy()
        truncated = ~terminated & (self._steps >= self.variant.episode_steps)
        done = np.flatnonzero(terminated | truncated)
        distractor = self._distractor_distance()  # before an autoreset moves the objects
        final = EpisodeSummary(
            env_ids=done,
            seeds=self._seeds[done],
            success=success[done],
            length=self._steps[done],
            episode_return=self._return[done],
        )
        if self.autoreset:
            for env in done:
                self._episode_count[env] += 1
                seed = next_episode_seed(int(self._reset_seeds[env]), int(self._episode_count[env]))
                self._start_episode(int(env), seed)
        self.timings["simulate"] += time.perf_counter() - start
        return StepResult(
            obs=self._observe(),
            reward=reward,
            terminated=terminated,
            truncated=truncated,
            success=success,
            final=final,
            info={
                "tcp_target_distance": distance,
                "tcp_target_distance_before": distance_before,
                "tcp_distractor_distance": distractor,
            },
        )

    # -- observation -------------------------------------------------------------------------

    def _observe(self, render_ids: Sequence[int] | None = None) -> BatchedObservation:
        n_arm = len(self._arm_columns)
        state = np.empty((self.num_envs, n_arm + 1), np.float32)
        state[:, :n_arm] = self._state[:, self._arm_columns]
        state[:, n_arm] = self._state[:, self._finger_columns].sum(axis=1)
        if self._renderer is not None:
            start = time.perf_counter()
            self._renderer.render(
                self._models, self._state, [self._images[c] for c in self.cameras], render_ids
            )
            self.timings["render"] += time.perf_counter() - start
        return BatchedObservation(
            images={c: img.copy() for c, img in self._images.items()},
            state=state,
            instruction=[lay.instruction if lay else "" for lay in self._layouts],
        )

    # -- ground truth ------------------------------------------------------------------------

    def privileged(self) -> dict[str, np.ndarray]:
        return {
            "tcp_pos": self._tcp.copy(),
            "target_pos": self._target_pos(),
            "arm_qpos": self._qpos()[:, self._index.arm_qpos].copy(),
        }

    @property
    def layouts(self) -> list[EpisodeLayout]:
        """The current episode layout of every environment."""
        return [lay for lay in self._layouts if lay is not None]

    @property
    def models(self) -> list[mujoco.MjModel]:
        """Each environment's model copy (what the batched rollout steps)."""
        return self._models

    @property
    def scene_index(self) -> SceneIndex:
        """Addresses of joints, actuators and sensors in the compiled scene."""
        return self._index

    @property
    def physics_state(self) -> np.ndarray:
        """Full physics state, ``(N, nstate)`` (MuJoCo ``mjSTATE_FULLPHYSICS``); a copy."""
        return self._state.copy()

    def close(self) -> None:
        if self._renderer is not None:
            self._renderer.close()
            self._renderer = None
        self._pool.close()
