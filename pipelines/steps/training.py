"""The training steps: the default VLA's base (pretrained once, then cached) and fine-tuning
(behaviour cloning, then PPO, SAC or GRPO in simulation when configured)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.progress import SILENT, Listener, rl_detail, status_lines, training_detail
from robo_pipe.errors import InputError
from sim_scenes.tasks import split_task_name
from stages.policy.types import policy_type

if TYPE_CHECKING:
    from stages.dataset.layout import DatasetRef
    from stages.policy.checkpoint import CheckpointRef


def pretrain_base(
    cfg: PipelineConfig, listener: Listener = SILENT, ray_address: str | None = None
) -> CheckpointRef | None:
    """The default VLA's base for ``cfg`` (pretrained once, then cached); None for a hub-vlm
    policy, which starts from its pretrained backbone."""
    if not policy_type(cfg.policy.type).needs_pretraining:
        return None
    from stages.finetune import pretrain, pretrain_variants

    def collected(done: int, total: int) -> None:
        # The demonstrations come first (the demo's 3,000 take minutes), then the steps.
        if done < total:
            listener.advanced("pretrain", done, "collecting the base's demonstrations")
        else:
            listener.started("pretrain", cfg.pretrain.bc.steps, "steps")

    demonstrations = cfg.pretrain.episodes_per_variant * len(
        pretrain_variants(cfg.scene.variant, cfg.pretrain)
    )
    listener.started("pretrain", demonstrations, "demonstrations")
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
        on_metrics=lambda m: listener.advanced("pretrain", m["step"], training_detail(m)),
        on_status=status_lines("pretrain", listener),
        on_collected=collected,
    )


def needs_dataset(cfg: PipelineConfig) -> bool:
    """Whether fine-tuning reads demonstrations (not for RL from the base's fresh adapters)."""
    return not (cfg.finetune.is_rl and cfg.finetune.warm_start == "none")


def finetune_policy(
    cfg: PipelineConfig,
    dataset: DatasetRef | Path | None,
    base: CheckpointRef | None,
    listener: Listener = SILENT,
    ray_address: str | None = None,
) -> CheckpointRef:
    """Fine-tune as ``cfg.finetune`` says: behaviour cloning of ``base`` (or of a hub-vlm
    backbone) on ``dataset``, then RL in simulation when ``algo`` is ppo, sac or grpo; with
    ``warm_start: none`` RL starts from ``base`` with fresh adapters and ``dataset`` is unused.
    Each part is cached and resumable."""
    from stages.finetune import finetune

    if needs_dataset(cfg):
        if dataset is None:
            raise InputError("finetune: behaviour cloning needs a dataset")
        listener.started("finetune", cfg.finetune.bc.steps, "BC steps")
        start = finetune(
            dataset,
            cfg.policy,
            cfg.finetune,
            base,
            cfg.seed,
            home_dir("checkpoints"),
            name=cfg.slug,
            ray_address=ray_address,
            on_metrics=lambda m: listener.advanced("finetune", m["step"], training_detail(m)),
            lineage={"config_hash": cfg.config_hash()},
            on_status=status_lines("finetune", listener),
            task=split_task_name(cfg.scene.variant)[0],
        )
    elif base is None:  # the config check refuses this; a caller passing no base is a bug
        raise AssertionError("RL from fresh adapters needs the default VLA's base")
    else:
        start = base
    if not cfg.finetune.is_rl:
        return start
    return rl_finetune_from(cfg, start, listener, ray_address)


def rl_finetune_from(
    cfg: PipelineConfig,
    start: CheckpointRef,
    listener: Listener = SILENT,
    ray_address: str | None = None,
    checkpoints: Path | None = None,
) -> CheckpointRef:
    """PPO, SAC or GRPO (``cfg.finetune.algo``) in simulation from ``start`` (a BC fine-tune, or a
    base with fresh adapters), under ``checkpoints`` (default the home's); cached, resumable."""
    from stages.finetune import rl_finetune

    algo, budget = cfg.finetune.algo, cfg.finetune.rl.time_budget_s
    begun = time.monotonic()

    def done(metrics: dict[str, Any]) -> float:
        return metrics["step"] if budget is None else min(budget, time.monotonic() - begun)

    if budget is None:
        listener.started("finetune", cfg.finetune.rl.iterations, f"{algo} iterations")
    else:  # the budget ends it, the iterations are a cap: "6 days left" would tell nobody much
        listener.started("finetune", budget, f"s of {algo}'s time budget")
    return rl_finetune(
        start,
        cfg.robot,
        cfg.scene,
        cfg.sim,
        cfg.finetune,
        cfg.seed,
        checkpoints or home_dir("checkpoints"),
        name=cfg.slug,
        ray_address=ray_address,
        on_metrics=lambda m: listener.advanced("finetune", done(m), rl_detail(algo, m)),
        lineage={"config_hash": cfg.config_hash()},
        lora=cfg.policy.lora,
        on_status=status_lines("finetune", listener),
    )
