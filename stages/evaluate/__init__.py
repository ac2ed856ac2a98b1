"""The evaluate stage: success rates with honest intervals, sharded over Ray, gated against a
baseline (see :mod:`stages.evaluate.run`)."""

from typing import TYPE_CHECKING

from stages import lazy_exports

if TYPE_CHECKING:
    from stages.evaluate.config import EvalConfig
    from stages.evaluate.report import EvalReport
    from stages.evaluate.run import evaluate
    from stages.evaluate.shards import ShardOutcome, check_policy_fits, suite_variants

__all__ = [
    "EvalConfig",
    "EvalReport",
    "ShardOutcome",
    "check_policy_fits",
    "evaluate",
    "suite_variants",
]
__getattr__ = lazy_exports(
    __name__,
    {
        "stages.evaluate.config": ("EvalConfig",),
        "stages.evaluate.report": ("EvalReport",),
        "stages.evaluate.run": ("evaluate",),
        "stages.evaluate.shards": ("ShardOutcome", "check_policy_fits", "suite_variants"),
    },
)
