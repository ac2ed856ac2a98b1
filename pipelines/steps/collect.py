"""The collect step: ``cfg``'s demonstrations into a LeRobot v3 dataset under the home."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.progress import SILENT, Listener, status_lines

if TYPE_CHECKING:
    from stages.dataset.layout import DatasetRef


def default_dataset(cfg: PipelineConfig) -> Path:
    """Where ``cfg``'s dataset is collected: ``$ROBO_PIPE_HOME/datasets/<dataset_name>``."""
    return home_dir("datasets") / cfg.dataset_name()


def collect_dataset(
    cfg: PipelineConfig,
    listener: Listener = SILENT,
    out: Path | None = None,
    ray_address: str | None = None,
) -> DatasetRef:
    """Collect (or finish, or reuse) ``cfg``'s demonstrations into a LeRobot v3 dataset at
    ``out`` (default :func:`default_dataset`); its provenance records the resolved config."""
    from stages.collect import ShardResult, collect

    listener.started("collect", cfg.collect.episodes, "episodes")
    start = time.perf_counter()
    done = solved = frames = 0

    def on_shard(result: ShardResult) -> None:
        nonlocal done, solved, frames
        done, solved = done + result.attempted, solved + result.solved
        frames += result.kept_frames
        rate = frames / (time.perf_counter() - start)
        listener.advanced(
            "collect", done, f"source success {solved / done:.0%}, {rate:,.0f} frames/s"
        )

    return collect(
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.collect,
        cfg.seed,
        out or default_dataset(cfg),
        ray_address,
        on_shard=on_shard,
        extra_provenance={"config": cfg.model_dump(mode="json"), "config_hash": cfg.config_hash()},
        on_status=status_lines("collect", listener),
    )
