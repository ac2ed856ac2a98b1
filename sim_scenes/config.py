"""Typed configuration of the simulated task and its backend (sections of a pipeline config)."""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim_scenes.touch import RewardTerms, available_variants, get_variant

BACKENDS = ("mujoco", "isaaclab")
"""Simulator backends: MuJoCo (built in) and Isaac Lab 3 on Newton (``make isaaclab-env``)."""


class RewardConfig(BaseModel):
    """Weights of the task's reward (:class:`sim_scenes.touch.RewardTerms`); a field left
    unset keeps the scene variant's own weight. RL fine-tuning's rollout workers compute
    rewards with these; datasets record the variant's defaults."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    success_bonus: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Paid once, on the step the episode is solved."""
    distance_weight: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Per metre of tool-centre-point to target distance, every step."""
    progress_weight: float | None = Field(default=None, ge=0.0, le=1000.0)
    """Per metre the tool centre point moved closer to the target during a step."""


class SceneConfig(BaseModel):
    """Which task variant to simulate and what the policy sees."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variant: str = "touch-mixed"
    """Scene variant name (``robo-pipe scenes`` lists them)."""
    cameras: list[str] = Field(default=["scene"], min_length=1)
    """Cameras rendered into observations, from the robot's cameras."""
    image_size: int = Field(default=64, ge=16, le=512)
    """Square image side, pixels."""
    reward: RewardConfig = RewardConfig()
    """Reward weights for RL fine-tuning (unset: the variant's)."""

    def reward_terms(self) -> RewardTerms:
        """The variant's reward terms with this config's overrides applied."""
        overrides = {k: v for k, v in self.reward.model_dump().items() if v is not None}
        return replace(get_variant(self.variant).reward, **overrides)

    @field_validator("variant")
    @classmethod
    def _known_variant(cls, name: str) -> str:
        if name not in available_variants():
            raise ValueError(
                f"unknown scene variant; valid choices: {', '.join(available_variants())}"
            )
        return name


class SimConfig(BaseModel):
    """Simulator backend and its parallelism."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    backend: Literal["mujoco", "isaaclab"] = "mujoco"
    """Simulator backend: ``mujoco`` (built in) or ``isaaclab`` (Isaac Lab 3 on Newton, in its
    own environment: ``make isaaclab-env``)."""
    num_envs: int = Field(default=16, ge=1, le=4096)
    """Environments stepped together in one process."""
    num_threads: int = Field(default=2, ge=1, le=256)
    """Physics threads for the batched rollout (MuJoCo; Warp's CPU kernels run on one)."""
    device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$")
    """Where the ``isaaclab`` backend simulates and renders: ``cpu`` or ``cuda[:K]``."""
