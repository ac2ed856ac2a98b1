"""Inference engines: ONNX Runtime runs an export and matches its reference; TensorRT's absence
is a clear message; a corrupt ONNX file is refused."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from deploy_edge.bundle.layout import ONNX_FILE, REFERENCE_FILE
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


class _FakeTensorRT:
    """Just enough of the ``tensorrt`` module to see how an engine is built (flags, builder
    flags), on a pretend GPU; ``version`` 10 has the FP16 builder flag, 11 has not."""

    class NetworkDefinitionCreationFlag:
        STRONGLY_TYPED = 1

    class MemoryPoolType:
        WORKSPACE = 0

    class TensorIOMode:
        INPUT, OUTPUT = 0, 1

    def __init__(self, version: str) -> None:
        self.__version__ = version
        self.networks: list[int] = []
        self.flags: list[str] = []
        fake = self

        class BuilderFlag:
            pass

        if version.startswith("10."):
            BuilderFlag.FP16 = "FP16"  # type: ignore[attr-defined]
        self.BuilderFlag = BuilderFlag

        class Logger:
            WARNING = 2

            def __init__(self, level: int) -> None:
                pass

        class Config:
            def set_memory_pool_limit(self, pool: int, size: int) -> None:
                pass

            def set_flag(self, flag: str) -> None:
                fake.flags.append(flag)

            def add_optimization_profile(self, profile: object) -> None:
                pass

        class Profile:
            def set_shape(self, *args: object) -> None:
                pass

        class Network:
            num_inputs = 0

        class Builder:
            platform_has_fast_fp16 = True

            def __init__(self, logger: object) -> None:
                pass

            def create_network(self, flags: int) -> Network:
                fake.networks.append(flags)
                return Network()

            def create_builder_config(self) -> Config:
                return Config()

            def create_optimization_profile(self) -> Profile:
                return Profile()

            def build_serialized_network(self, network: object, config: object) -> bytes:
                return b"plan"

        class OnnxParser:
            def __init__(self, network: object, logger: object) -> None:
                pass

            def parse_from_file(self, path: str) -> bool:
                return True

        class Engine:
            num_io_tensors = 0

            def create_execution_context(self) -> object:
                return object()

        class Runtime:
            def __init__(self, logger: object) -> None:
                pass

            def deserialize_cuda_engine(self, plan: bytes) -> Engine:
                return Engine()

        self.Logger, self.Builder, self.OnnxParser, self.Runtime = (
            Logger,
            Builder,
            OnnxParser,
            Runtime,
        )


@pytest.fixture
def fake_gpu(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Callable[[str, tuple[int, int]], Any]:
    """``install(tensorrt_version, sm)``: the fake TensorRT and a pretend CUDA GPU of that SM."""
    import sys

    import torch

    def install(version: str, sm: tuple[int, int]) -> _FakeTensorRT:
        trt = _FakeTensorRT(version)
        monkeypatch.setitem(sys.modules, "tensorrt", trt)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: sm)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: f"GPU-sm{sm[0]}{sm[1]}")
        monkeypatch.setattr(torch.cuda, "Stream", lambda *a: object())
        return trt

    return install


def test_tensorrt_builds_q_dq_variants_strongly_typed_and_fp16_with_its_flag(
    fake_gpu: Callable[[str, tuple[int, int]], Any], tmp_path: Path
) -> None:
    """TensorRT 10: an INT8 (or FP8, on SM 8.9+) Q/DQ variant is a strongly typed network with
    no precision flag; the FP32 graph in FP16 sets the FP16 builder flag on a weakly typed
    one; FP8 on Orin's SM 8.7 and FP16 on TensorRT 11 (no FP16 flag) say why they cannot."""
    from deploy_edge.engines import TensorRTEngine

    onnx_file = tmp_path / "policy.int8.onnx"
    onnx_file.write_bytes(b"graph")
    trt = fake_gpu("10.3.0", (8, 7))
    int8 = TensorRTEngine(onnx_file, "int8", explicit=True)
    assert trt.networks == [1 << 1] and trt.flags == [] and int8.precision == "int8"
    assert int8.key["typing"] == "strong" and list(tmp_path.glob("policy.int8.*.plan"))
    fp16 = TensorRTEngine(tmp_path / "policy.int8.onnx", "fp16")
    assert trt.networks[-1] == 0 and trt.flags == ["FP16"] and fp16.precision == "fp16"
    with pytest.raises(EngineUnavailable, match=r"FP8 needs a GPU of SM 8.9 or newer.*SM 8.7"):
        TensorRTEngine(onnx_file, "fp8", explicit=True)
    thor = fake_gpu("10.13.0", (11, 0))
    assert TensorRTEngine(onnx_file, "fp8", explicit=True).precision == "fp8"
    assert thor.networks == [1 << 1] and thor.flags == []
    fake_gpu("11.4.0", (9, 0))
    with pytest.raises(EngineUnavailable, match=r"TensorRT 11.4.0 has no FP16 builder flag"):
        TensorRTEngine(onnx_file, "fp16")
