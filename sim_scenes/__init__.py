"""Task scenes and simulator backends behind one batched-environment interface."""

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
