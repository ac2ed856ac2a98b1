"""Typed configuration of the simulated task and its backend (sections of a pipeline config)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim_scenes.touch import available_variants

BACKENDS = ("mujoco",)
"""Simulator backends this installation can build (Isaac Lab joins when installed)."""


class SceneConfig(BaseModel):
    """Which task variant to simulate and what the policy sees."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variant: str = "touch-mixed"
    """Scene variant name (``robo-pipe scenes`` lists them)."""
    cameras: list[str] = Field(default=["scene"], min_length=1)
    """Cameras rendered into observations, from the robot's cameras."""
    image_size: int = Field(default=64, ge=16, le=512)
    """Square image side, pixels."""

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

    backend: Literal["mujoco"] = "mujoco"
    """Simulator backend."""
    num_envs: int = Field(default=16, ge=1, le=4096)
    """Environments stepped together in one process."""
    num_threads: int = Field(default=2, ge=1, le=256)
    """Physics threads for the batched rollout."""
