"""The collect stage: demonstrations into a LeRobot v3 dataset (see :mod:`stages.collect.run`)."""

from typing import TYPE_CHECKING

from stages import lazy_exports

if TYPE_CHECKING:
    from stages.collect.config import CollectConfig
    from stages.collect.run import ShardResult, collect
    from stages.collect.sources import DemonstrationSource, make_source

__all__ = ["CollectConfig", "DemonstrationSource", "ShardResult", "collect", "make_source"]
__getattr__ = lazy_exports(
    __name__,
    {
        "stages.collect.config": ("CollectConfig",),
        "stages.collect.run": ("ShardResult", "collect"),
        "stages.collect.sources": ("DemonstrationSource", "make_source"),
    },
)
