"""A tiny exported policy shared by the engine, runtime and gate tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from stages.export import export
from stages.policy.checkpoint import new_policy, save_policy
from tests.stages.tiny_models import TINY_POLICY


@pytest.fixture(scope="session")
def export_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, 6, 6)
    root = tmp_path_factory.mktemp("export")
    save_policy(policy, root / "ckpt", None)
    return Path(export(root / "ckpt", root / "export").path)
