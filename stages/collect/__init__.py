"""The collect stage: demonstrations into a LeRobot v3 dataset (see :mod:`stages.collect.run`)."""

from stages.collect.config import CollectConfig
from stages.collect.run import ShardResult, collect
from stages.collect.sources import DemonstrationSource, make_source

__all__ = ["CollectConfig", "DemonstrationSource", "ShardResult", "collect", "make_source"]
