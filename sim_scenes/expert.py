"""Scripted expert for the touch task: damped-least-squares inverse kinematics on the tcp.

The expert reads privileged ground truth (the named object's position) and plans two waypoints:
hover 10 cm above the object with the tool pointing down, then descend onto it. Each control
step it takes one damped-least-squares step on a stacked task -- tcp position error (m) and the
tool axis' deviation from straight down (rad, weighted) -- and commands that joint change,
clipped to the robot's per-step limit. Closing the loop every step absorbs linearisation error
and objects that get nudged.
"""

from __future__ import annotations

import mujoco
import numpy as np

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation

HOVER_HEIGHT = 0.10
"""m above the object centre for the approach waypoint."""
TOUCH_HEIGHT = 0.028
"""m above the object centre for the touch waypoint (just on top of a 5 cm object)."""
ALIGN_RADIUS = 0.015
"""m of horizontal tcp error below which the expert starts descending."""
ORIENTATION_WEIGHT = 0.15
"""m per rad: how much pointing the tool down matters against tcp position error."""
DAMPING = 0.05
"""Damped-least-squares damping (lambda), in the units of the stacked task error."""
GRIPPER_OPENING = 0.02
"""m, the gripper opening the expert holds (the task only needs a touch)."""


class ScriptedExpert:
    """Closed-loop IK expert acting on a :class:`BatchedEnv` of the touch task."""

    def __init__(self, robot: RobotSpec) -> None:
        self.robot = robot
        self._model = robot.load_model()
        self._data = mujoco.MjData(self._model)
        self._arm_qpos = np.array(
            [
                self._model.jnt_qposadr[
                    mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_JOINT, j.name)
                ]
                for j in robot.arm
            ]
        )
        self._arm_dof = np.array(
            [
                self._model.jnt_dofadr[
                    mujoco.mj_name2id(self._model, mujoco.mjtObj.mjOBJ_JOINT, j.name)
                ]
                for j in robot.arm
            ]
        )
        self._tcp = mujoco.mj_name2id(
            self._model, mujoco.mjtObj.mjOBJ_SITE, robot.authored.tcp_site
        )
        self._jacp = np.zeros((3, self._model.nv))
        self._jacr = np.zeros((3, self._model.nv))

    def __call__(self, env: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
        """Acting-function form (see :data:`sim_scenes.episodes.ActFn`); ignores ``obs``."""
        return self.act(env)

    def act(self, env: BatchedEnv) -> np.ndarray:
        """Actions for every environment of ``env``, shape ``(N, action_dim)``."""
        truth = env.privileged()
        actions = np.zeros((env.num_envs, self.robot.action.dim))
        for i in range(env.num_envs):
            actions[i, :-1] = self._joint_step(truth["arm_qpos"][i], truth["target_pos"][i])
        actions[:, -1] = GRIPPER_OPENING
        return actions

    def _joint_step(self, arm_q: np.ndarray, target: np.ndarray) -> np.ndarray:
        model, data = self._model, self._data
        data.qpos[self._arm_qpos] = arm_q
        mujoco.mj_kinematics(model, data)
        mujoco.mj_comPos(model, data)
        tcp = data.site_xpos[self._tcp]
        horizontal = np.linalg.norm(target[:2] - tcp[:2])
        height = TOUCH_HEIGHT if horizontal < ALIGN_RADIUS else HOVER_HEIGHT
        waypoint = target + np.array([0.0, 0.0, height])
        mujoco.mj_jacSite(model, data, self._jacp, self._jacr, self._tcp)
        tool_axis = data.site_xmat[self._tcp].reshape(3, 3)[:, 2]
        # Rotation that takes the tool axis onto straight down, as an angle-axis vector.
        rot_error = np.cross(tool_axis, np.array([0.0, 0.0, -1.0]))
        error = np.concatenate([waypoint - tcp, ORIENTATION_WEIGHT * rot_error])
        jac = np.vstack([self._jacp, ORIENTATION_WEIGHT * self._jacr])[:, self._arm_dof]
        dq = jac.T @ np.linalg.solve(jac @ jac.T + DAMPING**2 * np.eye(6), error)
        limit = self.robot.authored.max_joint_delta
        scale = max(1.0, float(np.abs(dq).max()) / limit)  # keep the direction when clipping
        return dq / scale
