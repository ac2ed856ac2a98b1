"""The touch task as an Isaac Lab 3 environment (kit-less, Newton physics, Newton Warp cameras).

Runs only in the Isaac Lab environment (Python 3.12, ``make isaaclab-env``); nothing in the main
environment imports this module. It is the task of :mod:`sim_scenes.touch` as the MuJoCo backend
runs it:

- the robot is the USD that ``robo-pipe assets build`` converts from the robot's own MJCF, with
  its position servos' gains (kp, kv, force range) read from that MJCF;
- table and objects are Isaac Lab primitives (nothing comes from NVIDIA's asset server): one
  object per (colour, shape) pair the variant can draw, parked behind the scene camera when a
  scene does not use it, since a scene never holds the same pair twice;
- every episode's layout (objects, named target, initial arm pose) is drawn from its seed by
  the very :func:`sim_scenes.touch.sample_layout` MuJoCo uses;
- actions, state, control rate (``decimation`` physics steps of ``physics_timestep``),
  success criterion, reward and episode length are the variant's.

What differs from MuJoCo (see docs/isaaclab.md): the key light's position and
intensity jitter and the scene camera's position jitter are not applied (the Newton Warp
renderer has one default directional light, and moving a camera per environment does not reach
it, IsaacLab issue #7676), and shading differs between the two renderers.

Tensors are ``(num_envs, ...)`` on ``cfg.sim.device``; quaternions are (x, y, z, w) as in
Isaac Lab 3. Units: metres, radians, seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from isaaclab.envs import DirectRLEnv
from isaaclab.utils.math import quat_apply

from robots.spec import get_robot
from sim_scenes.isaaclab.touch_env_cfg import (
    TouchEnvCfg,
    object_pairs,
    park_position,
    task_variant,
    tcp_frame,
)
from sim_scenes.seeds import next_episode_seed
from sim_scenes.touch import (
    OBJECT_HALF_HEIGHT,
    sample_layout,
)

TASK_ID = "RoboPipe-Touch-v0"


class TouchEnv(DirectRLEnv):
    """The touch task on Isaac Lab; see the module docstring.

    Episodes are seeded per environment: :meth:`set_seeds` names the seed each environment's
    next reset draws its layout from; an environment that autoresets draws its ``k``-th next
    episode from :func:`sim_scenes.seeds.next_episode_seed`, as the MuJoCo backend does.
    Observations are ``{"policy": state (N, state_dim), "images": {camera: uint8 (N, H, W, 3)}}``.
    """

    cfg: TouchEnvCfg

    def __init__(self, cfg: TouchEnvCfg, render_mode: str | None = None, **kwargs: object) -> None:
        super().__init__(cfg, render_mode, **kwargs)
        self.robot_spec = get_robot(cfg.robot_name)
        self.variant = task_variant(cfg)
        self.robot = self.scene["robot"]
        self.objects = self.scene["objects"]
        self.pairs = object_pairs(self.variant)
        n_arm = len(self.robot_spec.arm)
        self._arm_ids = [self.robot.find_joints(j.name)[0][0] for j in self.robot_spec.arm]
        self._finger_ids = [self.robot.find_joints(j.name)[0][0] for j in self.robot_spec.gripper]
        tcp_body, tcp_offset = tcp_frame(self.robot_spec)
        self._hand_id = self.robot.find_bodies(tcp_body)[0][0]
        self._tcp_offset = torch.tensor(tcp_offset, device=self.device).expand(self.num_envs, 3)
        dev = self.device
        self._joint_low = torch.tensor([j.low for j in self.robot_spec.arm], device=dev)
        self._joint_high = torch.tensor([j.high for j in self.robot_spec.arm], device=dev)
        self._finger_high = torch.tensor([j.high for j in self.robot_spec.gripper], device=dev)
        self._max_delta = self.robot_spec.authored.max_joint_delta
        self._targets = torch.zeros(self.num_envs, n_arm + len(self._finger_ids), device=dev)
        self._target_object = torch.zeros(self.num_envs, dtype=torch.long, device=dev)
        self._hold = torch.zeros(self.num_envs, dtype=torch.long, device=dev)
        self.distance = torch.zeros(self.num_envs, device=dev)
        """tcp to named object, m: after the last step, or at the start of a new episode."""
        self.step_distance = torch.zeros(self.num_envs, device=dev)
        """tcp to named object after the last step, m, even for envs that reset since."""
        self.step_distractor_distance = torch.full((self.num_envs,), math.inf, device=dev)
        """tcp to the nearest other object on the table after the last step, m (inf: none)."""
        self._on_table = torch.zeros(self.num_envs, len(self.pairs), dtype=torch.bool, device=dev)
        """Which objects each environment's layout placed (the others are parked)."""
        self.distance_before = torch.zeros(self.num_envs, device=dev)
        self.success = torch.zeros(self.num_envs, dtype=torch.bool, device=dev)
        self.seeds = np.zeros(self.num_envs, np.int64)
        """The seed of each environment's current episode."""
        self.instructions = [""] * self.num_envs
        self._next_seeds: dict[int, int] = {}
        self._reset_seeds = np.zeros(self.num_envs, np.int64)
        self._episode_count = np.zeros(self.num_envs, np.int64)
        self._stepping = False

    # -- seeds and layouts ---------------------------------------------------------------------

    def set_seeds(self, env_ids: Sequence[int], seeds: Sequence[int]) -> None:
        """Seeds the given environments' next episodes draw their layouts from."""
        for env, seed in zip(env_ids, seeds, strict=True):
            self._next_seeds[int(env)] = int(seed)

    def reset_envs(self, env_ids: Sequence[int], seeds: Sequence[int]) -> dict:
        """Start new episodes from ``seeds`` in the given environments only; all observations."""
        self.set_seeds(env_ids, seeds)
        self._reset_idx(torch.as_tensor(list(env_ids), device=self.device, dtype=torch.long))
        self.obs_buf = self._get_observations()
        return self.obs_buf

    def step(self, action: torch.Tensor):  # type: ignore[no-untyped-def]
        self._stepping = True
        try:
            return super().step(action)
        finally:
            self._stepping = False

    def tcp_pos(self) -> torch.Tensor:
        """Tool centre point, (N, 3) m, relative to each environment's origin."""
        pose = self.robot.data.body_link_pose_w.torch[:, self._hand_id]
        return pose[:, :3] + quat_apply(pose[:, 3:7], self._tcp_offset) - self.scene.env_origins

    def target_pos(self) -> torch.Tensor:
        """Centre of each environment's named object, (N, 3) m, relative to its origin."""
        poses = self.objects.data.body_link_pose_w.torch
        picked = poses[torch.arange(self.num_envs, device=self.device), self._target_object]
        return picked[:, :3] - self.scene.env_origins

    def distractor_distance(self) -> torch.Tensor:
        """Tool centre point to the nearest object on the table that is not the named one,
        (N,) m (inf when there is none)."""
        centres = (
            self.objects.data.body_link_pose_w.torch[..., :3] - self.scene.env_origins[:, None]
        )
        gaps = torch.linalg.norm(centres - self.tcp_pos()[:, None], dim=2)
        others = self._on_table.clone()
        others[torch.arange(self.num_envs, device=self.device), self._target_object] = False
        return torch.where(others, gaps, torch.full_like(gaps, math.inf)).min(dim=1).values

    def arm_qpos(self) -> torch.Tensor:
        """Arm joint positions, (N, n_arm) rad."""
        return self.robot.data.joint_pos.torch[:, self._arm_ids]

    # -- DirectRLEnv ---------------------------------------------------------------------------

    def _pre_physics_step(self, actions: torch.Tensor) -> None:
        n_arm = len(self._arm_ids)
        delta = actions[:, :n_arm].clamp(-self._max_delta, self._max_delta)
        arm = torch.minimum(
            torch.maximum(self.arm_qpos() + delta, self._joint_low), self._joint_high
        )
        fingers = (actions[:, n_arm:] / len(self._finger_ids)).clamp(min=0.0)
        self._targets[:, :n_arm] = arm
        self._targets[:, n_arm:] = torch.minimum(
            fingers.expand(-1, len(self._finger_ids)), self._finger_high
        )

    def _apply_action(self) -> None:
        self.robot.set_joint_position_target_index(
            target=self._targets, joint_ids=self._arm_ids + self._finger_ids
        )

    def _get_observations(self) -> dict:
        joints = self.robot.data.joint_pos.torch
        state = torch.cat(
            [joints[:, self._arm_ids], joints[:, self._finger_ids].sum(dim=1, keepdim=True)], dim=1
        )
        images = {
            name: self.scene[f"camera_{name}"].data.output["rgb"].torch[..., :3]
            for name in self.cfg.cameras
        }
        return {"policy": state, "images": images}

    def _get_dones(self) -> tuple[torch.Tensor, torch.Tensor]:
        criterion = self.variant.success
        distance = torch.linalg.norm(self.tcp_pos() - self.target_pos(), dim=1)
        self.distance_before = self.distance.clone()
        self.distance = distance
        self.step_distance = distance.clone()  # a reset in this step moves self.distance on
        self.step_distractor_distance = self.distractor_distance()
        self._hold = torch.where(distance < criterion.radius, self._hold + 1, 0)
        self.success = self._hold >= criterion.hold_steps
        truncated = ~self.success & (self.episode_length_buf >= self.variant.episode_steps)
        return self.success.clone(), truncated

    def _get_rewards(self) -> torch.Tensor:
        terms = self.variant.reward
        return (
            terms.success_bonus * self.success.float()
            - terms.distance_weight * self.distance
            + terms.progress_weight * (self.distance_before - self.distance)
        )

    def _reset_idx(self, env_ids: Sequence[int] | torch.Tensor | None) -> None:
        if env_ids is None:
            env_ids = torch.arange(self.num_envs, device=self.device)
        if self._stepping and not self.cfg.autoreset:
            return  # finished environments keep their final state until reset_envs
        ids = torch.as_tensor(env_ids, device=self.device, dtype=torch.long)
        super()._reset_idx(ids)
        n = len(ids)
        joint_pos = self.robot.data.default_joint_pos.torch[ids].clone()
        object_poses = torch.zeros(n, len(self.pairs), 7, device=self.device)
        object_poses[..., 6] = 1.0
        for slot in range(len(self.pairs)):
            object_poses[:, slot, :3] = torch.tensor(park_position(slot), device=self.device)
        for row, env in enumerate(ids.tolist()):
            seed = self._next_seeds.pop(env, None)
            if seed is None:  # an autoreset
                self._episode_count[env] += 1
                seed = next_episode_seed(int(self._reset_seeds[env]), int(self._episode_count[env]))
            else:
                self._reset_seeds[env], self._episode_count[env] = seed, 0
            layout = sample_layout(
                self.variant, self.robot_spec, seed, self.cfg.retarget, self.cfg.phrasing
            )
            self.seeds[env] = seed
            self.instructions[env] = layout.instruction
            joint_pos[row, self._arm_ids] = torch.tensor(layout.arm_qpos, device=self.device)
            self._on_table[env] = False
            for k, obj in enumerate(layout.objects):
                slot = self.pairs.index((obj.colour, obj.shape))
                self._on_table[env, slot] = True
                half = obj.yaw / 2
                object_poses[row, slot] = torch.tensor(
                    [
                        obj.xy[0],
                        obj.xy[1],
                        OBJECT_HALF_HEIGHT,
                        0.0,
                        0.0,
                        math.sin(half),
                        math.cos(half),
                    ],
                    device=self.device,
                )
                if k == layout.target:
                    self._target_object[env] = slot
        object_poses[..., :3] += self.scene.env_origins[ids][:, None, :]
        root = self.robot.data.default_root_pose.torch[ids].clone()
        root[:, :3] += self.scene.env_origins[ids]
        self.robot.write_root_pose_to_sim_index(root_pose=root, env_ids=ids)
        self.robot.write_root_velocity_to_sim_index(
            root_velocity=torch.zeros(n, 6, device=self.device), env_ids=ids
        )
        self.robot.write_joint_position_to_sim_index(position=joint_pos, env_ids=ids)
        self.robot.write_joint_velocity_to_sim_index(
            velocity=torch.zeros_like(joint_pos), env_ids=ids
        )
        self._targets[ids] = joint_pos[:, self._arm_ids + self._finger_ids]
        self.robot.set_joint_position_target_index(
            target=self._targets[ids], joint_ids=self._arm_ids + self._finger_ids, env_ids=ids
        )
        self.objects.write_body_pose_to_sim_index(body_poses=object_poses, env_ids=ids)
        self.objects.write_body_velocity_to_sim_index(
            body_velocities=torch.zeros(n, len(self.pairs), 6, device=self.device), env_ids=ids
        )
        self._hold[ids] = 0
        # distance at the episode's start, for the first step's progress term
        self.scene.write_data_to_sim()
        self.sim.forward()
        self.scene.update(dt=0.0)
        self.distance[ids] = torch.linalg.norm(self.tcp_pos() - self.target_pos(), dim=1)[ids]


gym.register(
    id=TASK_ID,
    entry_point=f"{__name__}:TouchEnv",
    disable_env_checker=True,
    # make_touch_cfg, not TouchEnvCfg: the bare class has no robot, objects or cameras
    kwargs={"env_cfg_entry_point": "sim_scenes.isaaclab.touch_env_cfg:make_touch_cfg"},
)
