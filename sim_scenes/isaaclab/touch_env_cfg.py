"""The touch task's Isaac Lab 3 configuration: its scene (robot, table, objects, cameras) and
environment config classes, built for a robot and a task variant by :func:`make_touch_cfg`.

Runs only in the Isaac Lab environment, like :mod:`sim_scenes.isaaclab.touch_env` (the
environment itself, whose docstring says how the task maps onto Isaac Lab); split as Isaac Lab's
own task folders are, a config module beside its env module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path

import isaaclab.sim as sim_utils
import mujoco
from isaaclab.actuators import ImplicitActuatorCfg
from isaaclab.assets import (
    ArticulationCfg,
    AssetBaseCfg,
    RigidObjectCfg,
    RigidObjectCollectionCfg,
)
from isaaclab.envs import DirectRLEnvCfg
from isaaclab.scene import InteractiveSceneCfg
from isaaclab.sensors import CameraCfg
from isaaclab.sim import SimulationCfg
from isaaclab.utils import configclass
from isaaclab_newton.physics import MJWarpSolverCfg, NewtonCfg
from isaaclab_newton.renderers import NewtonWarpRendererCfg

from robots.spec import RobotSpec, get_robot
from sim_scenes.isaaclab.assets import srgb_to_linear
from sim_scenes.touch import (
    COLOURS,
    OBJECT_HALF_HEIGHT,
    Phrasing,
    SceneError,
    SceneVariant,
    get_variant,
)

"""Gymnasium id of this task."""

TABLE_COLOUR = (0.62, 0.56, 0.48)
TABLE_HALF_SIZE = 1.5
"""m; the MuJoCo table is a plane of this half-size."""
PARK_X = 1.2
"""m; unused objects rest here, behind the scene camera, out of every camera's view."""


def robot_usd(robot: RobotSpec) -> Path:
    """The robot's USD, converted from its MJCF by ``robo-pipe assets build``."""
    return robot.authored.mjcf.parent / "usd" / f"{robot.authored.mjcf.stem}.usda"


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


def tcp_frame(robot: RobotSpec) -> tuple[str, tuple[float, float, float]]:
    """(body, position in that body, m) of the MJCF's tool-centre-point site (USD has no sites,
    so the task computes the tcp from its body's pose)."""
    model = robot.load_model()
    site = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SITE, robot.authored.tcp_site)
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
    phrasing: Phrasing = "trained"
    """``trained`` or ``unseen`` (:func:`sim_scenes.touch.sample_layout`)."""
    success_radius: float | None = None
    """m; None: the variant's (the scene config's ``success.radius``)."""
    hold_steps: int | None = None
    """None: the variant's (the scene config's ``success.hold_steps``)."""
    episode_steps: int | None = None
    """None: the variant's (the scene config's ``episode_steps``)."""
    success_bonus: float | None = None
    """None: the variant's reward term (:class:`sim_scenes.rewards.RewardTerms`; RL's rollouts
    play the scene config's ``scene.reward``), as are the two below."""
    distance_weight: float | None = None
    progress_weight: float | None = None
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
    terms = {
        "success_bonus": cfg.success_bonus,
        "distance_weight": cfg.distance_weight,
        "progress_weight": cfg.progress_weight,
    }
    reward = replace(spec.reward, **{k: v for k, v in terms.items() if v is not None})
    return replace(spec, success=success, episode_steps=steps, reward=reward)


def make_touch_cfg(
    robot_name: str = "rp5",
    variant: str = "touch-mixed",
    num_envs: int = 16,
    cameras: Sequence[str] = ("scene",),
    image_size: int = 64,
    device: str = "cpu",
    retarget: int = 0,
    phrasing: Phrasing = "trained",
    autoreset: bool = True,
    success_radius: float | None = None,
    hold_steps: int | None = None,
    episode_steps: int | None = None,
    reward: Mapping[str, float] | None = None,
) -> TouchEnvCfg:
    """The task's config for a robot, scene variant, batch size, cameras and device; the
    success criterion, episode length and reward terms (by field name) override the variant's
    where given."""
    robot = get_robot(robot_name)
    cfg = TouchEnvCfg(robot_name=robot_name, variant=variant, cameras=tuple(cameras))
    cfg.image_size, cfg.retarget, cfg.autoreset = image_size, retarget, autoreset
    cfg.phrasing = phrasing
    cfg.success_radius, cfg.hold_steps, cfg.episode_steps = (
        success_radius,
        hold_steps,
        episode_steps,
    )
    for name, value in (reward or {}).items():
        setattr(cfg, name, value)
    spec = task_variant(cfg)
    cfg.sim.dt = robot.authored.physics_timestep
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
                **dict(zip([j.name for j in robot.arm], robot.authored.home_arm, strict=True)),
                **{j.name: robot.authored.home_gripper / len(robot.gripper) for j in robot.gripper},
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
