"""Inference engines: ONNX Runtime runs an export and matches its reference; TensorRT's absence
is a clear message; a corrupt ONNX file is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from deploy_edge.bundle import ONNX_FILE, REFERENCE_FILE
from deploy_edge.engines import (
    EngineError,
    EngineUnavailable,
    OnnxRuntimeEngine,
    make_engine,
    plan_matches,
)


def test_onnxruntime_engine_reproduces_the_reference(export_dir: Path) -> None:
    engine = make_engine(export_dir / ONNX_FILE)
    assert isinstance(engine, OnnxRuntimeEngine) and engine.name.startswith("onnxruntime:")
    reference = dict(np.load(export_dir / REFERENCE_FILE))
    got = engine.run({n: reference[n] for n in engine.input_names})
    assert engine.output_names == ["actions", "action_std"]
    for name in engine.output_names:
        np.testing.assert_allclose(got[name], reference[f"expected_{name}"], atol=1e-4)
    assert {"engine", "precision", "onnxruntime", "cpu"} <= set(engine.describe())


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here"
)
def test_tensorrt_absence_is_a_clear_message(export_dir: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"TensorRT is not available here.*onnxruntime"):
        make_engine(export_dir / ONNX_FILE, engine="tensorrt")


def test_corrupt_onnx_and_unknown_engines_are_refused(export_dir: Path, tmp_path: Path) -> None:
    bad = tmp_path / ONNX_FILE
    bad.write_bytes((export_dir / ONNX_FILE).read_bytes()[:100])
    with pytest.raises(EngineError, match="ONNX Runtime cannot load it"):
        make_engine(bad)
    with pytest.raises(EngineError, match="unknown engine 'openvino'"):
        make_engine(export_dir / ONNX_FILE, engine="openvino")


def test_a_plan_is_reused_only_for_the_exact_machine_key(tmp_path: Path) -> None:
    key = {"gpu": "Orin", "sm": "87", "tensorrt": "10.3", "cuda": "12.6", "precision": "fp16"}
    plan = tmp_path / "policy.Orin.plan"
    assert not plan_matches(plan, key), "nothing built yet"
    plan.write_bytes(b"engine")
    plan.with_suffix(".json").write_text(json.dumps(key))
    assert plan_matches(plan, key)
    for field, other in (
        ("tensorrt", "10.7"),
        ("cuda", "12.2"),
        ("sm", "89"),
        ("precision", "fp32"),
    ):
        assert not plan_matches(plan, {**key, field: other}), field
    plan.with_suffix(".json").write_text("{broken")
    assert not plan_matches(plan, key)


def _tensorrt_gpu() -> bool:
    if importlib.util.find_spec("tensorrt") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


@pytest.mark.gpu
@pytest.mark.skipif(
    not _tensorrt_gpu(), reason="needs TensorRT and a CUDA GPU (Jetson or GPU host)"
)
def test_tensorrt_engine_builds_passes_preflight_and_is_cached(export_dir: Path) -> None:
    from deploy_edge.engines import TensorRTEngine

    reference = dict(np.load(export_dir / REFERENCE_FILE))
    engine = TensorRTEngine(export_dir / ONNX_FILE, "fp16", reference=reference)
    plans = list(export_dir.glob("*.plan"))
    assert len(plans) == 1 and plan_matches(plans[0], engine.key)
    again = TensorRTEngine(export_dir / ONNX_FILE, "fp16", reference=reference)
    assert list(export_dir.glob("*.plan")) == plans and again.key == engine.key
