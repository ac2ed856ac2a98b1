"""The register stage's rules: which promotion gates a candidate passed, whether any blocks it
from ``champion``, and how gate results are written into (and read back from) registry tags.

Plain functions over typed records; the MLflow side (model versions, aliases) is
:mod:`pipelines.registry`.
"""

from stages.register.config import PromotionConfig
from stages.register.gates import (
    GATE_TAG,
    Gate,
    blocking_gates,
    failed_gates,
    gate_tags,
    gates_from_tags,
    history_after_promotion,
    may_promote,
    meets_min_success,
    promotion_gates,
    rollback_target,
)

__all__ = [
    "GATE_TAG",
    "Gate",
    "PromotionConfig",
    "blocking_gates",
    "failed_gates",
    "gate_tags",
    "gates_from_tags",
    "history_after_promotion",
    "may_promote",
    "meets_min_success",
    "promotion_gates",
    "rollback_target",
]
