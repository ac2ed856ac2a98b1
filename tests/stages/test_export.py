"""The export stage: parity on random and real dataset inputs, the I/O spec, refusal."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from stages.dataset.layout import DatasetRef
from stages.export.onnx import ExportError, export_policy
from stages.policy.checkpoint import new_policy, save_policy
from tests.stages.tiny_models import TINY_POLICY


@pytest.fixture()
def checkpoint(tmp_path: Path) -> Path:
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, 6, 6)
    save_policy(policy, tmp_path / "ckpt", None)
    return tmp_path / "ckpt"


def test_export_parity_spec_and_files(
    checkpoint: Path, tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    ref = export_policy(checkpoint, tmp_path / "export", dataset=tiny_dataset.path)
    assert set(ref.parity) == {"random", "dataset"}
    assert max(ref.parity.values()) < 1e-4 and ref.parity_max_abs_error == max(ref.parity.values())
    model = onnx.load(ref.onnx)
    onnx.checker.check_model(model)
    assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 18
    batch_dim = model.graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param, "the batch axis is dynamic"
    spec = json.loads((tmp_path / "export" / "io_spec.json").read_text())
    assert [i["name"] for i in spec["inputs"]] == ["image_scene", "state", "tokens", "token_mask"]
    assert spec["chunk_len"] == 3 and spec["control_hz"] == 10.0
    assert all(t["units"] and t["shape"][0] == "batch" for t in spec["inputs"] + spec["outputs"])
    reference = np.load(tmp_path / "export" / "reference.npz")
    assert reference["expected_actions"].shape == (8, 3, 6)
    assert (tmp_path / "export" / "tokenizer" / "tokenizer.json").is_file()


def test_an_export_outside_tolerance_is_refused_and_replaces_nothing(
    checkpoint: Path, tmp_path: Path
) -> None:
    good = export_policy(checkpoint, tmp_path / "export")
    with pytest.raises(ExportError, match="differs from torch"):
        export_policy(
            checkpoint, tmp_path / "export", tolerance=0.0 if good.parity_max_abs_error else -1.0
        )
    assert (tmp_path / "export" / "policy.onnx").is_file(), "the good export is untouched"
