"""Robot definitions: MJCF models, limits, control rate, cameras, and the real-robot interface.

Importing this package selects a headless OpenGL backend for MuJoCo (EGL unless the user set
``MUJOCO_GL``): MuJoCo reads that variable once, at import, so it must be set before anything
imports ``mujoco``.
"""

import os

os.environ.setdefault("MUJOCO_GL", "egl")

from robots.interface import Robot, RobotObservation
from robots.spec import (
    ActionSpec,
    CameraSpec,
    JointSpec,
    RobotDefinitionError,
    RobotSpec,
    available_robots,
    get_robot,
    load_robot,
)

__all__ = [
    "ActionSpec",
    "CameraSpec",
    "JointSpec",
    "Robot",
    "RobotDefinitionError",
    "RobotObservation",
    "RobotSpec",
    "available_robots",
    "get_robot",
    "load_robot",
]
