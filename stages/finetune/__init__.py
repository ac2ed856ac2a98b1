"""Training stages on Ray: ``pretrain`` (the base VLA), ``finetune`` (LoRA/BC) and
``rl_finetune`` (PPO or SAC in simulation) (see :mod:`stages.finetune.run`)."""

from typing import TYPE_CHECKING

from stages import lazy_exports

if TYPE_CHECKING:
    from stages.finetune.config import FinetuneConfig, PretrainConfig
    from stages.finetune.run import MetricsFn, finetune, pretrain, pretrain_variants, rl_finetune

__all__ = [
    "FinetuneConfig",
    "MetricsFn",
    "PretrainConfig",
    "finetune",
    "pretrain",
    "pretrain_variants",
    "rl_finetune",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "stages.finetune.config": ("FinetuneConfig", "PretrainConfig"),
        "stages.finetune.run": (
            "MetricsFn",
            "finetune",
            "pretrain",
            "pretrain_variants",
            "rl_finetune",
        ),
    },
)
