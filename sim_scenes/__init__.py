"""Task scenes and simulator backends behind one batched-environment interface.

- the task, the same on every backend: :mod:`~sim_scenes.touch` (vocabulary, variants, layouts,
  success and reward), :mod:`~sim_scenes.seeds` (the seed streams episodes are drawn from),
  :mod:`~sim_scenes.expert` (the scripted expert, on privileged ground truth);
- the interface: :mod:`~sim_scenes.batched_env`, and :mod:`~sim_scenes.episodes` playing seeded
  episodes on it;
- the backends, one folder each (``mujoco/``, ``isaaclab/``), chosen by name in
  :mod:`~sim_scenes.backends`; :mod:`~sim_scenes.sim_robot` puts any of them behind the
  real-robot interface; :mod:`~sim_scenes.config` types the ``scene:`` and ``sim:`` sections;
- simulators that cannot load into this environment run in worker processes
  (:mod:`~sim_scenes.worker_process`, :mod:`~sim_scenes.worker_protocol`): Isaac Lab's backend,
  and ``metaworld/`` (Meta-World's own tasks, MT10 among them, and their scripted experts).
"""

from sim_scenes.batched_env import BatchedEnv, BatchedObservation, EpisodeSummary, StepResult
from sim_scenes.touch import (
    SceneError,
    SceneVariant,
    available_variants,
    get_variant,
    heldout_variants,
)

__all__ = [
    "BatchedEnv",
    "BatchedObservation",
    "EpisodeSummary",
    "SceneError",
    "SceneVariant",
    "StepResult",
    "available_variants",
    "get_variant",
    "heldout_variants",
]
