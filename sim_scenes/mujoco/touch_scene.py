"""The touch task's scene in MuJoCo: the robot's MJCF plus the table, key light and
``MAX_OBJECTS`` object slots, compiled once (:func:`build_scene`); a layout
(:func:`sim_scenes.touch.sample_layout`) is applied per environment by changing colours,
collision flags, light and camera positions on that environment's copy of the compiled model
(:func:`apply_layout`), which keeps every copy the same "size signature" so one native batched
rollout can step them all.

Units: metres, radians, seconds; positions are in the robot base frame (z up, table top at 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import mujoco
import numpy as np

from robots.spec import RobotSpec
from sim_scenes.touch import COLOURS, OBJECT_HALF_HEIGHT, SHAPES, EpisodeLayout

MAX_OBJECTS = 4
"""Object slots in the compiled scene (the most objects a variant may place); unused slots are
parked out of sight."""


def build_scene(robot: RobotSpec, image_size: int) -> mujoco.MjModel:
    """Compile the robot plus table, key light and ``MAX_OBJECTS`` object slots.

    Each slot is a free body carrying one geom per shape; :func:`apply_layout` shows and enables
    the one shape it needs. Rendering settings are tuned for small offscreen frames (no shadows,
    no multisampling, framebuffer the size of the image), which FACTS measured ~70x faster.
    """
    spec = mujoco.MjSpec.from_file(str(robot.authored.mjcf))
    spec.option.timestep = robot.authored.physics_timestep
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    spec.visual.quality.shadowsize = 0
    spec.visual.quality.offsamples = 0
    spec.visual.global_.offwidth = image_size
    spec.visual.global_.offheight = image_size
    spec.visual.headlight.ambient = [0.35, 0.35, 0.35]
    spec.visual.headlight.diffuse = [0.3, 0.3, 0.3]

    world = spec.worldbody
    world.add_geom(
        name="table",
        type=mujoco.mjtGeom.mjGEOM_PLANE,
        size=[1.5, 1.5, 0.05],
        rgba=[0.62, 0.56, 0.48, 1],
    )
    world.add_light(
        name="key",
        pos=[0.3, -0.4, 1.5],
        dir=[0, 0.2, -1],
        diffuse=[0.7, 0.7, 0.7],
        castshadow=False,
    )
    for i in range(MAX_OBJECTS):
        body = world.add_body(name=f"object{i}", pos=[2.0 + 0.2 * i, 0, OBJECT_HALF_HEIGHT])
        body.add_freejoint(name=f"object{i}")
        h = OBJECT_HALF_HEIGHT
        sizes = {"cube": [h, h, h], "ball": [h, 0, 0], "cylinder": [0.022, h, 0]}
        types = {
            "cube": mujoco.mjtGeom.mjGEOM_BOX,
            "ball": mujoco.mjtGeom.mjGEOM_SPHERE,
            "cylinder": mujoco.mjtGeom.mjGEOM_CYLINDER,
        }
        for shape in SHAPES:
            body.add_geom(
                name=f"object{i}_{shape}",
                type=types[shape],
                size=sizes[shape],
                mass=0.05,
                rgba=[0.5, 0.5, 0.5, 0],
                contype=1,
                conaffinity=1,
                friction=[1.0, 0.02, 0.001],
            )
    # Geoms compile with collisions on so that the body-level broad-phase flags (an OR over a
    # body's geoms, fixed at compile time) admit the slot; apply_layout turns off the hidden
    # shapes. Rolling friction keeps balls where they were put unless something pushes them.
    return spec.compile()


@dataclass(frozen=True)
class SceneIndex:
    """Addresses in a compiled scene that the simulator needs every step."""

    arm_qpos: np.ndarray
    """qpos addresses of the arm joints, shape (n_arm,)."""
    gripper_qpos: np.ndarray
    """qpos addresses of the finger joints, shape (n_fingers,)."""
    object_qpos: np.ndarray
    """qpos address of each slot's free joint (position x, y, z then quaternion)."""
    object_geoms: np.ndarray
    """Geom ids, shape (MAX_OBJECTS, len(SHAPES))."""
    arm_actuators: np.ndarray
    gripper_actuators: np.ndarray
    key_light: int
    scene_camera: int
    tcp_sensor_adr: int
    """Offset of the tcp position (3 values) in sensordata."""


def index_scene(model: mujoco.MjModel, robot: RobotSpec) -> SceneIndex:
    """Resolve names to the addresses :class:`SceneIndex` documents."""

    def jid(name: str) -> int:
        return int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name))

    def aid(name: str) -> int:
        return int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_ACTUATOR, name))

    sensor = int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_SENSOR, "tcp_pos"))
    return SceneIndex(
        arm_qpos=np.array([model.jnt_qposadr[jid(j.name)] for j in robot.arm]),
        gripper_qpos=np.array([model.jnt_qposadr[jid(j.name)] for j in robot.gripper]),
        object_qpos=np.array([model.jnt_qposadr[jid(f"object{i}")] for i in range(MAX_OBJECTS)]),
        object_geoms=np.array(
            [
                [
                    mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"object{i}_{s}")
                    for s in SHAPES
                ]
                for i in range(MAX_OBJECTS)
            ]
        ),
        arm_actuators=np.array([aid(j.name) for j in robot.arm]),
        gripper_actuators=np.array([aid(j.name) for j in robot.gripper]),
        key_light=int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_LIGHT, "key")),
        scene_camera=int(mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_CAMERA, "scene")),
        tcp_sensor_adr=int(model.sensor_adr[sensor]),
    )


def apply_layout(
    model: mujoco.MjModel,
    nominal: mujoco.MjModel,
    index: SceneIndex,
    layout: EpisodeLayout,
    qpos: np.ndarray,
    robot: RobotSpec,
) -> None:
    """Write ``layout`` into one environment's model copy and initial ``qpos`` (in place).

    ``nominal`` is the unmodified compiled scene that jitter is applied around.
    """
    qpos[:] = nominal.qpos0
    qpos[index.arm_qpos] = layout.arm_qpos
    qpos[index.gripper_qpos] = robot.authored.home_gripper / len(index.gripper_qpos)
    for slot in range(MAX_OBJECTS):
        adr = index.object_qpos[slot]
        geoms = index.object_geoms[slot]
        model.geom_rgba[geoms, 3] = 0.0
        model.geom_contype[geoms] = 0
        model.geom_conaffinity[geoms] = 0
        if slot < len(layout.objects):
            obj = layout.objects[slot]
            x, y = obj.xy
            shown = geoms[SHAPES.index(obj.shape)]
        else:  # park unused slots beside the table, resting, invisible
            x, y, obj = 2.0 + 0.2 * slot, 0.0, None
            shown = geoms[0]
        qpos[adr : adr + 3] = (x, y, OBJECT_HALF_HEIGHT)
        yaw = obj.yaw if obj is not None else 0.0
        qpos[adr + 3 : adr + 7] = (math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2))
        model.geom_contype[shown] = 1
        model.geom_conaffinity[shown] = 1
        if obj is not None:
            model.geom_rgba[shown] = (*COLOURS[obj.colour], 1.0)
    model.light_pos[index.key_light] = layout.light_pos
    model.light_diffuse[index.key_light] = (layout.light_intensity,) * 3
    model.cam_pos[index.scene_camera] = nominal.cam_pos[index.scene_camera] + np.asarray(
        layout.camera_offset
    )
