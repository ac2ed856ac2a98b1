"""The expert demo's settings (``demo:`` in a pipeline config)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class DemoConfig(BaseModel):
    """The expert demonstration shown by ``robo-pipe expert``."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    episodes: int = Field(default=200, ge=1, le=100_000)
    """Episodes the scripted expert plays to measure its success rate."""
    filmstrip_episodes: int = Field(default=4, ge=1, le=64)
    """Episodes drawn frame by frame into the demo's filmstrip image."""
