"""Typed configuration of the data collection stage (the ``collect:`` section)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class CollectConfig(BaseModel):
    """How many demonstrations to collect, from which source, with what parallelism."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    episodes: int = Field(default=2000, ge=1, le=10_000_000)
    """Episodes to attempt (seeds from the run's ``collect`` seed stream)."""
    source: Literal["scripted_expert"] = "scripted_expert"
    """Demonstration source (see ``stages/collect/sources.py``)."""
    workers: int = Field(default=2, ge=0, le=1024)
    """Ray rollout workers (one CPU each); 0 collects in the calling process without Ray."""
    envs_per_worker: int = Field(default=16, ge=1, le=4096)
    """Batched environments per worker."""
    episodes_per_shard: int = Field(default=100, ge=1, le=100_000)
    """Episodes committed together: the unit of atomic writes, resume and data files, and what
    a restarted worker collects again."""
    max_worker_restarts: int = Field(default=3, ge=0, le=1000)
    """Times Ray restarts each worker whose process dies (killed, out of memory); the shard it
    was collecting is collected again. One more death stops the collect with
    ``WorkersDiedError`` (committed shards stay: the same command resumes)."""
    action_noise: float = Field(default=0.0, ge=0.0, le=1.0)
    """Standard deviation of Gaussian noise added to each action the source sends, as a
    fraction of each component's half range (``robot.action``); the dataset records the
    source's own action. A demonstration then shows the source recovering from the small
    errors a learned policy makes (DART, Laskey et al. 2017); behaviour cloning on noise-free
    demonstrations never sees a missed grasp, so its policy never retries one. 0: no noise."""
    keep_failed: bool = False
    """Keep episodes the source failed (default: drop them, but count them in the metadata)."""
    video_crf: int = Field(default=0, ge=0, le=51)
    """H.264 constant rate factor; 0 is lossless in YUV (best for small images)."""
