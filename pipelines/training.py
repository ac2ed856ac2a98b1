"""The training stages called with a pipeline config.

One place maps the config's sections to the stage functions' arguments and puts their outputs
under ``$ROBO_PIPE_HOME``; the CLI, the Prefect tasks and the benchmarks all call these.
The torch stack is imported when a function runs, not when this module is imported.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.home import home_dir

if TYPE_CHECKING:
    from stages.dataset.layout import DatasetRef
    from stages.finetune.run import MetricsFn
    from stages.policy.checkpoint import CheckpointRef


def pretrain_base(
    cfg: PipelineConfig,
    ray_address: str | None = None,
    on_metrics: MetricsFn | None = None,
    on_status: Callable[[str], None] | None = None,
) -> CheckpointRef:
    """The default VLA's base for ``cfg`` (pretrained once, then cached)."""
    from stages.finetune.run import pretrain

    return pretrain(
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.collect,
        cfg.policy,
        cfg.pretrain,
        cfg.seed,
        home_dir("checkpoints"),
        home_dir("datasets"),
        ray_address,
        on_metrics=on_metrics,
        on_status=on_status,
    )


def bc_finetune(
    cfg: PipelineConfig,
    dataset: DatasetRef | str | Path,
    base: CheckpointRef | None,
    ray_address: str | None = None,
    on_metrics: MetricsFn | None = None,
) -> CheckpointRef:
    """Behaviour cloning of ``base`` (or a hub-vlm backbone) on ``dataset``, as ``cfg.finetune``
    says (cached)."""
    from stages.finetune.run import finetune

    return finetune(
        dataset,
        cfg.policy,
        cfg.finetune,
        base,
        cfg.seed,
        home_dir("checkpoints"),
        name=cfg.name,
        ray_address=ray_address,
        on_metrics=on_metrics,
        lineage={"config_hash": cfg.config_hash()},
    )


def rl_finetune_from(
    cfg: PipelineConfig,
    start: CheckpointRef,
    ray_address: str | None = None,
    on_metrics: MetricsFn | None = None,
    checkpoints_dir: Path | None = None,
) -> CheckpointRef:
    """PPO or SAC (``cfg.finetune.algo``) in simulation from ``start`` (cached, resumable)."""
    from stages.finetune.run import rl_finetune

    return rl_finetune(
        start,
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.finetune,
        cfg.seed,
        checkpoints_dir or home_dir("checkpoints"),
        name=cfg.name,
        ray_address=ray_address,
        on_metrics=on_metrics,
        lineage={"config_hash": cfg.config_hash()},
        lora=cfg.policy.lora,
    )
