"""When a registered version becomes ``champion`` (the ``registry.promotion`` config section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class PromotionConfig(BaseModel):
    """When a registered version becomes ``champion``: every enabled gate must pass."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    min_success: float = Field(default=0.7, ge=0.0, le=1.0)
    """Held-out success rate (all evaluated variants together) the candidate must reach."""
    min_success_on: Literal["lower_bound", "estimate"] = "lower_bound"
    """What ``min_success`` is compared with: the lower end of the 95% Wilson interval (the
    default: a policy passes only when the episodes show it reaches the bar) or the point
    estimate (passes a policy just below the bar about half the time)."""
    no_regression: bool = True
    """The candidate must not be worse than the current champion on the same seeds
    (``evaluate.gate_confidence``, one-sided exact McNemar test on the discordant seeds)."""
    margin: float = Field(default=0.0, ge=0.0, lt=1.0)
    """Regressions up to this many success-rate points (0..1) are tolerated: the candidate is
    blocked only when Newcombe's paired interval puts the difference below ``-margin``
    (0: exact McNemar)."""
    latency: bool = True
    """The latency gate must pass."""
    at_latency: bool = True
    """The candidate's success at the inference delay its target will have must hold: at
    ``min_success``, not worse than at zero delay nor than the champion at the same delay
    (:mod:`stages.evaluate.at_delay`)."""
