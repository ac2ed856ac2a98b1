"""When a registered version becomes ``champion`` (the ``registry.promotion`` config section)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class PromotionConfig(BaseModel):
    """When a registered version becomes ``champion``: every enabled gate must pass."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_success: float = Field(default=0.7, ge=0.0, le=1.0)
    """Held-out success rate (all evaluated variants together) the candidate must reach."""
    no_regression: bool = True
    """The candidate must not be worse than the current champion on the same seeds
    (``evaluate.gate_confidence``, one-sided two-proportion test)."""
    latency: bool = True
    """The latency gate must pass."""
