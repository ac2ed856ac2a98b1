"""Simulator backends by name (``sim.backend``): the one place a backend is chosen.

A backend is a folder under ``sim_scenes/`` holding a :class:`~sim_scenes.batched_env.BatchedEnv`
subclass, which says which ``sim:`` settings its constructor takes (``sim_options``), which
simulator version decides its episodes (``simulator_version``) and whether it can start on this
machine (``check_available``). :data:`~sim_scenes.config.BACKENDS` names each by its entry
point, imported only here and only when that backend is used: the config validates names
without loading any simulator, and a MuJoCo run never imports the Isaac Lab client. Adding a
backend is its folder plus one line in that table (it sits beside the ``sim.backend`` field it
types, so the config needs nothing from this module).
"""

from __future__ import annotations

import pkgutil
from collections.abc import Sequence
from typing import TYPE_CHECKING

from sim_scenes.config import BACKENDS, SceneConfig, SimConfig
from sim_scenes.tasks import TaskVariant
from sim_scenes.touch import Phrasing, SceneError

if TYPE_CHECKING:
    from robots.spec import RobotSpec
    from sim_scenes.batched_env import BatchedEnv


def backend_class(name: str) -> type[BatchedEnv]:
    """The batched-env class of backend ``name``; unknown names list the valid choices."""
    if name not in BACKENDS:
        raise SceneError(
            f"unknown simulator backend {name!r}; valid choices: {', '.join(BACKENDS)}"
        )
    backend: type[BatchedEnv] = pkgutil.resolve_name(BACKENDS[name])
    return backend


def open_env(
    robot: RobotSpec,
    variant: TaskVariant,
    sim: SimConfig,
    *,
    num_envs: int,
    cameras: Sequence[str],
    image_size: int,
    autoreset: bool = True,
    retarget: int = 0,
    phrasing: Phrasing = "trained",
) -> BatchedEnv:
    """``num_envs`` environments of ``variant`` on the backend ``sim`` names, with that
    backend's own settings from ``sim`` (arguments as :class:`BatchedEnv`'s)."""
    backend = backend_class(sim.backend)
    return backend(
        robot,
        variant,
        num_envs,
        cameras,
        image_size,
        autoreset=autoreset,
        retarget=retarget,
        phrasing=phrasing,
        **backend.sim_options(sim),
    )


def make_env(
    robot: RobotSpec,
    scene: SceneConfig,
    sim: SimConfig,
    *,
    num_envs: int | None = None,
    cameras: tuple[str, ...] | None = None,
    autoreset: bool = True,
    retarget: int = 0,
    phrasing: Phrasing = "trained",
) -> BatchedEnv:
    """Create ``num_envs`` (default ``sim.num_envs``) environments of ``scene.variant`` (with
    the scene config's task overrides) on the backend ``sim`` names.

    ``cameras`` overrides ``scene.cameras``; pass ``()`` for physics only. ``retarget`` names
    another object of each scene, ``phrasing="unseen"`` words its instruction in the unseen
    phrasings (see :func:`sim_scenes.touch.sample_layout`).
    """
    return open_env(
        robot,
        scene.task(),
        sim,
        num_envs=sim.num_envs if num_envs is None else num_envs,
        cameras=tuple(scene.cameras) if cameras is None else cameras,
        image_size=scene.image_size,
        autoreset=autoreset,
        retarget=retarget,
        phrasing=phrasing,
    )


def simulator_version(sim: SimConfig) -> str:
    """The simulator ``sim`` names and its version (part of what decides an episode)."""
    return backend_class(sim.backend).simulator_version(sim)


def check_backend(sim: SimConfig) -> None:
    """The backend ``sim`` names can start on this machine (Isaac Lab needs its own
    environment); raises an error that says how to fix it otherwise."""
    backend_class(sim.backend).check_available(sim)
