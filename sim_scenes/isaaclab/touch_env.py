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

What differs from MuJoCo (see the README's Isaac Lab section): the key light's position and
intensity jitter and the scene camera's position jitter are not applied (the Newton Warp
renderer has one default directional light, and moving a camera per environment does not reach
it, IsaacLab issue #7676), and shading differs between the two renderers.

Tensors are ``(num_envs, ...)`` on ``cfg.sim.device``; quaternions are (x, y, z, w) as in
Isaac Lab 3. Units: metres, radians, seconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import isaaclab.sim as sim_utils
import mujoco
import numpy as np
import torch
from isaaclab.actuators import ImplicitActuatorCfg
from isaaclab.assets import (
    ArticulationCfg,
    AssetBaseCfg,
    RigidObjectCfg,
    RigidObjectCollectionCfg,
)
from isaaclab.envs import DirectRLEnv, DirectRLEnvCfg
from isaaclab.scene import InteractiveSceneCfg
from isaaclab.sensors import CameraCfg
from isaaclab.sim import SimulationCfg
from isaaclab.utils import configclass
from isaaclab.utils.math import quat_apply
from isaaclab_newton.physics import MJWarpSolverCfg, NewtonCfg
from isaaclab_newton.renderers import NewtonWarpRendererCfg

from robots.spec import RobotSpec, get_robot
from sim_scenes.isaaclab.assets import srgb_to_linear
from sim_scenes.seeds import next_episode_seed
from sim_scenes.touch import (
    COLOURS,
    OBJECT_HALF_HEIGHT,
    SceneError,
    SceneVariant,
    get_variant,
    sample_layout,
)

TASK_ID = "RoboPipe-Touch-v0"
"""Gymnasium id of this task."""

TABLE_COLOUR = (0.62, 0.56, 0.48)
TABLE_HALF_SIZE = 1.5
"""m; the MuJoCo table is a plane of this half-size."""
PARK_X = 1.2
"""m; unused objects rest here, behind the scene camera, out of every camera's view."""


def robot_usd(robot: RobotSpec) -> Path:
    """The robot's USD, converted from its MJCF by ``robo-pipe assets build``."""
    return robot.definition.mjcf.parent / "usd" / f"{robot.definition.mjcf.stem}.usda"


def object_pairs(variant: SceneVariant) -> list[tuple[str, str]]:
    """Every (colour, shape) a scene of ``variant`` can hold, in a fixed order."""
    pairs = {(c, s) for c in variant.colours for s in variant.shapes}
    return sorted(pairs)


def _servo_gains(model: mujoco.MjModel) -> dict[str, tuple[float, float, float]]:
    """Joint name -> (kp, kv, force limit) of the MJCF's position actuators."""
    gains = {}
    for i in range(model.nu):
        joint = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_JOINT, model.actuator_trnid[i, 0])
        kp = float(model.actuator_gainprm[i, 0])
        kv = float(-model.actuator_biasprm[i, 2])
        gains[joint] = (kp, kv, float(model.actuator_forcerange[i, 1]))
    return gains


def _camera_offset(model: mujoco.MjModel, name: str) -> tuple[str, CameraCfg.OffsetCfg, float]:
    """(parent body, pose in that body in the OpenGL convention, vertical fov in degrees) of an
    MJCF camera: MuJoCo cameras look along -z with +y up, which is USD's (OpenGL) convention."""
    cam = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, name)
    body_id = int(model.cam_bodyid[cam])
    if body_id == 0:  # a work-cell camera: ride on the fixed root link, which sits at the origin
        body_id = 1
        if model.body_pos[1].any() or model.body_quat[1][0] != 1.0:
            raise SceneError(f"camera {name!r}: the robot's root link is not at the origin")
    body = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, body_id)
    w, x, y, z = (float(v) for v in model.cam_quat[cam])
    pos = tuple(float(v) for v in model.cam_pos[cam])
    offset = CameraCfg.OffsetCfg(pos=pos, rot=(x, y, z, w), convention="opengl")
    return body, offset, float(model.cam_fovy[cam])


def _body_paths(model: mujoco.MjModel) -> dict[str, str]:
    """MJCF body name -> its prim path below the robot prim (the converter nests bodies)."""
    paths: dict[str, str] = {}
    for b in range(1, model.nbody):
        name = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, b)
        parent = int(model.body_parentid[b])
        paths[name] = (
            f"{paths[mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, parent)]}/{name}"
            if parent
            else f"Geometry/{name}"
        )
    return paths


def _tcp_frame(robot: RobotSpec) -> tuple[str, tuple[float, float, float]]:
    """(body, position in that body, m) of the MJCF's tool-centre-point site (USD has no sites,
    so the task computes the tcp from its body's pose)."""
    model = robot.load_model()
    site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, robot.definition.tcp_site)
    body = mujoco.mj_id2name(model, mujoco.mjtObj.mjOBJ_BODY, model.site_bodyid[site])
    x, y, z = (float(v) for v in model.site_pos[site])
    return body, (x, y, z)


def _object_cfg(colour: str, shape: str, slot: int) -> RigidObjectCfg:
    h = OBJECT_HALF_HEIGHT
    common = dict(
        rigid_props=sim_utils.RigidBodyPropertiesCfg(),
        mass_props=sim_utils.MassPropertiesCfg(mass=0.05),
        collision_props=sim_utils.CollisionPropertiesCfg(),
        physics_material=sim_utils.RigidBodyMaterialCfg(static_friction=1.0, dynamic_friction=1.0),
        # MJCF colours are display (sRGB) values, USD's are linear: the renderer re-encodes them
        visual_material=sim_utils.PreviewSurfaceCfg(
            diffuse_color=srgb_to_linear(COLOURS[colour]), roughness=1.0
        ),
    )
    if shape == "cube":
        spawn = sim_utils.CuboidCfg(size=(2 * h, 2 * h, 2 * h), **common)
    elif shape == "ball":
        spawn = sim_utils.SphereCfg(radius=h, **common)
    else:
        spawn = sim_utils.CylinderCfg(radius=0.022, height=2 * h, **common)
    return RigidObjectCfg(
        prim_path=f"{{ENV_REGEX_NS}}/Object_{colour}_{shape}",
        spawn=spawn,
        init_state=RigidObjectCfg.InitialStateCfg(pos=park_position(slot)),
    )


def park_position(slot: int) -> tuple[float, float, float]:
    """Resting place of the ``slot``-th unused object, m."""
    return (PARK_X, -1.2 + 0.15 * slot, OBJECT_HALF_HEIGHT)


@configclass
class TouchSceneCfg(InteractiveSceneCfg):
    """Robot, table, objects and cameras; filled in by :func:`make_touch_cfg`."""

    robot: ArticulationCfg = None
    table: AssetBaseCfg = AssetBaseCfg(
        prim_path="{ENV_REGEX_NS}/Table",
        spawn=sim_utils.CuboidCfg(
            size=(2 * TABLE_HALF_SIZE, 2 * TABLE_HALF_SIZE, 0.05),
            collision_props=sim_utils.CollisionPropertiesCfg(),
            visual_material=sim_utils.PreviewSurfaceCfg(
                diffuse_color=srgb_to_linear(TABLE_COLOUR), roughness=1.0
            ),
        ),
        init_state=AssetBaseCfg.InitialStateCfg(pos=(0.0, 0.0, -0.025)),
    )
    objects: RigidObjectCollectionCfg = None


@configclass
class TouchEnvCfg(DirectRLEnvCfg):
    """The touch task; build one with :func:`make_touch_cfg`."""

    robot_name: str = "rp5"
    variant: str = "touch-mixed"
    cameras: tuple[str, ...] = ("scene",)
    image_size: int = 64
    retarget: int = 0
    success_radius: float | None = None
    """m; None: the variant's (the scene config's ``success.radius``)."""
    hold_steps: int | None = None
    """None: the variant's (the scene config's ``success.hold_steps``)."""
    episode_steps: int | None = None
    """None: the variant's (the scene config's ``episode_steps``)."""
    autoreset: bool = True
    """Reset finished environments inside ``step`` (Isaac Lab's way); False leaves them in their
    final state until :meth:`TouchEnv.reset_envs`."""
    decimation: int = 10
    episode_length_s: float = 5.0
    action_space: int = 6
    observation_space: int = 6
    state_space: int = 0
    sim: SimulationCfg = SimulationCfg(
        dt=0.01,
        device="cpu",
        physics=NewtonCfg(
            solver_cfg=MJWarpSolverCfg(
                njmax=200, nconmax=100, integrator="implicitfast", cone="pyramidal"
            ),
            use_cuda_graph=False,
        ),
    )
    scene: TouchSceneCfg = TouchSceneCfg(num_envs=16, env_spacing=4.0, replicate_physics=True)


def task_variant(cfg: TouchEnvCfg) -> SceneVariant:
    """The config's scene variant with its success criterion and episode length applied."""
    spec = get_variant(cfg.variant)
    success = replace(
        spec.success,
        radius=spec.success.radius if cfg.success_radius is None else cfg.success_radius,
        hold_steps=spec.success.hold_steps if cfg.hold_steps is None else cfg.hold_steps,
    )
    steps = spec.episode_steps if cfg.episode_steps is None else cfg.episode_steps
    return replace(spec, success=success, episode_steps=steps)


def make_touch_cfg(
    robot_name: str = "rp5",
    variant: str = "touch-mixed",
    num_envs: int = 16,
    cameras: Sequence[str] = ("scene",),
    image_size: int = 64,
    device: str = "cpu",
    retarget: int = 0,
    autoreset: bool = True,
    success_radius: float | None = None,
    hold_steps: int | None = None,
    episode_steps: int | None = None,
) -> TouchEnvCfg:
    """The task's config for a robot, scene variant, batch size, cameras and device; the
    success criterion and episode length override the variant's where given."""
    robot = get_robot(robot_name)
    cfg = TouchEnvCfg(robot_name=robot_name, variant=variant, cameras=tuple(cameras))
    cfg.image_size, cfg.retarget, cfg.autoreset = image_size, retarget, autoreset
    cfg.success_radius, cfg.hold_steps, cfg.episode_steps = (
        success_radius,
        hold_steps,
        episode_steps,
    )
    spec = task_variant(cfg)
    cfg.sim.dt = robot.definition.physics_timestep
    cfg.sim.device = device
    cfg.sim.physics.use_cuda_graph = device.startswith("cuda")
    cfg.decimation = robot.substeps
    cfg.episode_length_s = spec.episode_steps / robot.control_hz
    cfg.action_space = robot.action.dim
    cfg.observation_space = len(robot.state_names)
    cfg.scene.num_envs = num_envs

    model = robot.load_model()
    gains = _servo_gains(model)
    joints = [j.name for j in (*robot.arm, *robot.gripper)]
    cfg.scene.robot = ArticulationCfg(
        prim_path="{ENV_REGEX_NS}/Robot",
        # Gravity compensation (the MJCF's gravcomp="1") is in the USD: mjc:gravcomp, which
        # Newton's MuJoCo solver reads (it ignores PhysX's disable_gravity).
        spawn=sim_utils.UsdFileCfg(usd_path=str(robot_usd(robot))),
        init_state=ArticulationCfg.InitialStateCfg(
            joint_pos={
                **dict(zip([j.name for j in robot.arm], robot.definition.home_arm, strict=True)),
                **{
                    j.name: robot.definition.home_gripper / len(robot.gripper)
                    for j in robot.gripper
                },
            }
        ),
        actuators={
            j: ImplicitActuatorCfg(
                joint_names_expr=[j],
                stiffness=gains[j][0],
                damping=gains[j][1],
                effort_limit_sim=gains[j][2],
            )
            for j in joints
        },
    )
    cfg.scene.objects = RigidObjectCollectionCfg(
        rigid_objects={
            f"{c}_{s}": _object_cfg(c, s, slot) for slot, (c, s) in enumerate(object_pairs(spec))
        }
    )
    paths = _body_paths(model)
    paths_root = next(iter(paths))
    for name in cameras:
        body, offset, fovy = _camera_offset(model, name)
        focal = 24.0  # mm; the aperture sets the field of view
        aperture = 2 * focal * math.tan(math.radians(fovy) / 2)
        setattr(
            cfg.scene,
            f"camera_{name}",
            CameraCfg(
                prim_path=f"{{ENV_REGEX_NS}}/Robot/{paths[body]}/camera_{name}",
                offset=offset,
                data_types=["rgb"],
                spawn=sim_utils.PinholeCameraCfg(
                    focal_length=focal,
                    horizontal_aperture=aperture,
                    vertical_aperture=aperture,
                    clipping_range=(0.01, 10.0),
                ),
                width=image_size,
                height=image_size,
                # a camera on a moving link must follow it (else it keeps its first pose)
                update_latest_camera_pose=body != paths_root,
                renderer_cfg=NewtonWarpRendererCfg(use_cuda_graph=device.startswith("cuda")),
            ),
        )
    return cfg


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
        tcp_body, tcp_offset = _tcp_frame(self.robot_spec)
        self._hand_id = self.robot.find_bodies(tcp_body)[0][0]
        self._tcp_offset = torch.tensor(tcp_offset, device=self.device).expand(self.num_envs, 3)
        dev = self.device
        self._joint_low = torch.tensor([j.low for j in self.robot_spec.arm], device=dev)
        self._joint_high = torch.tensor([j.high for j in self.robot_spec.arm], device=dev)
        self._finger_high = torch.tensor([j.high for j in self.robot_spec.gripper], device=dev)
        self._max_delta = self.robot_spec.definition.max_joint_delta
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
            layout = sample_layout(self.variant, self.robot_spec, seed, self.cfg.retarget)
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
    kwargs={"env_cfg_entry_point": f"{__name__}:make_touch_cfg"},
)
