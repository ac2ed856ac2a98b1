"""Build a batched environment from config, whichever simulator backend it names."""

from __future__ import annotations

from typing import Any

from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv
from sim_scenes.config import BACKENDS, SceneConfig, SimConfig
from sim_scenes.touch import SceneError


def make_env(
    robot: RobotSpec,
    scene: SceneConfig,
    sim: SimConfig,
    *,
    num_envs: int | None = None,
    cameras: tuple[str, ...] | None = None,
    autoreset: bool = True,
    retarget: int = 0,
) -> BatchedEnv:
    """Create ``num_envs`` (default ``sim.num_envs``) environments of ``scene.variant``.

    ``cameras`` overrides ``scene.cameras``; pass ``()`` for physics only. ``retarget`` names
    another object of each scene (see :func:`sim_scenes.touch.sample_layout`).
    """
    variant = scene.task()
    common: dict[str, Any] = {
        "num_envs": sim.num_envs if num_envs is None else num_envs,
        "cameras": tuple(scene.cameras) if cameras is None else cameras,
        "image_size": scene.image_size,
        "autoreset": autoreset,
        "retarget": retarget,
    }
    if sim.backend == "mujoco":
        from sim_scenes.mujoco_env import MujocoBatchedEnv

        return MujocoBatchedEnv(robot, variant, num_threads=sim.num_threads, **common)
    if sim.backend == "isaaclab":
        from sim_scenes.isaaclab.client import IsaacLabBatchedEnv

        return IsaacLabBatchedEnv(robot, variant, device=sim.device, **common)
    raise SceneError(
        f"unknown simulator backend {sim.backend!r}; valid choices: {', '.join(BACKENDS)}"
    )


def simulator_version(sim: SimConfig) -> str:
    """The simulator ``sim`` names and its version (part of what decides an episode)."""
    if sim.backend == "mujoco":
        import mujoco

        return f"mujoco=={mujoco.__version__}"
    if sim.backend == "isaaclab":
        from sim_scenes.isaaclab.env import isaaclab_python

        return f"isaaclab:{isaaclab_python().parent.parent}"  # its folder names the release
    raise SceneError(
        f"unknown simulator backend {sim.backend!r}; valid choices: {', '.join(BACKENDS)}"
    )
