"""Typed configuration of training (the ``pretrain:`` and ``finetune:`` sections)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sim_scenes.touch import available_variants


class BCConfig(BaseModel):
    """Behaviour cloning on Ray Train: optimisation, augmentation, parallelism, checkpoints."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    steps: int = Field(default=2000, ge=1, le=10_000_000)
    """Optimizer steps (each over ``batch_size`` samples, summed over workers)."""
    batch_size: int = Field(default=64, ge=1, le=65_536)
    """Samples per optimizer step, split evenly across workers."""
    lr: float = Field(default=1e-3, gt=0, le=1.0)
    """Peak learning rate (AdamW)."""
    weight_decay: float = Field(default=1e-4, ge=0, le=1.0)
    warmup_steps: int = Field(default=50, ge=0)
    """Linear warm-up, then cosine decay to zero."""
    grad_clip: float = Field(default=1.0, gt=0)
    """Global gradient-norm clip."""
    aux_weight: float = Field(default=1.0, ge=0)
    """Weight of the auxiliary loss (the named object's (x, y) from the vision tokens)."""
    image_shift: int = Field(default=2, ge=0, le=16)
    """Random image translation augmentation, ± pixels."""
    workers: int = Field(default=1, ge=0, le=1024)
    """Ray Train workers (DDP when > 1); 0 trains in the calling process without Ray."""
    checkpoint_every: int = Field(default=250, ge=1)
    """Steps between checkpoints (training resumes from the latest)."""
    log_every: int = Field(default=25, ge=1)
    """Steps between logged metrics (loss, samples/s)."""


class PretrainConfig(BaseModel):
    """The base model: the full default VLA trained once on a broad task family, then cached."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variants: list[str] | None = None
    """Scene variants to pretrain on; default: every training variant except the target
    (``scene.variant``)."""
    episodes_per_variant: int = Field(default=1000, ge=1, le=1_000_000)
    """Demonstrations collected per pretraining variant."""
    bc: BCConfig = BCConfig(steps=3000)

    @field_validator("variants")
    @classmethod
    def _known_variants(cls, names: list[str] | None) -> list[str] | None:
        train = available_variants("train")
        for name in names or []:
            if name not in train:
                raise ValueError(
                    f"{name!r} is not a training scene variant; valid choices: {', '.join(train)}"
                )
        return names


class FinetuneConfig(BaseModel):
    """Fine-tuning the base on the target task's demonstrations."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    algo: Literal["bc"] = "bc"
    """Training algorithm (behaviour cloning; RL arrives with PPO/SAC)."""
    trainable: Literal["lora", "all"] = "lora"
    """``lora``: freeze the base, train LoRA adapters + heads; ``all``: full fine-tuning."""
    bc: BCConfig = BCConfig()
