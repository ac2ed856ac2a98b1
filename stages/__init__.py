"""Pipeline stages as plain functions over typed configs and artifact records (no Prefect).

Each stage is a package that exports its entry point under a verb (``stages.collect.collect``,
``stages.finetune.pretrain`` / ``finetune`` / ``rl_finetune``, ``stages.evaluate.evaluate``),
implemented in its ``run.py``; its typed config lives in ``config.py``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, exports: dict[str, tuple[str, ...]]) -> Callable[[str], Any]:
    """A package's ``__getattr__`` (PEP 562) that imports each exported name from its module
    (``exports``: module -> names) on first use, so that a stage's config loads without the
    stage's heavy imports (torch, the simulator) -- the CLI imports every config at start-up."""
    where = {name: module for module, names in exports.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(where[name]), name)

    return __getattr__
