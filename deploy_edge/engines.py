"""Inference engines: one interface, two implementations, built on the machine that runs them.

- :class:`OnnxRuntimeEngine`: ONNX Runtime, on the CPU by default; the TensorRT and CUDA
  execution providers are used when ONNX Runtime has them (``providers`` preference order).
- :class:`TensorRTEngine`: a TensorRT engine built from the ONNX file *on the target* (FP16 when
  the GPU supports it, an optimisation profile for the batch sizes), serialised next to the
  ONNX file under a key of GPU name, SM version, TensorRT and CUDA versions and precision. A
  cached engine is used only when its key matches this machine exactly; otherwise it is
  rebuilt, never reused. Loading runs a preflight: the engine deserialises and the reference
  input gives outputs matching the ONNX reference.

Precision variants (``policy.int8.onnx``: a graph with explicit Q/DQ nodes) run as they are:
ONNX Runtime executes the Q/DQ graph on the CPU (its quantised kernels); TensorRT builds it the
way NVIDIA recommends since TensorRT 10 deprecated implicit INT8 calibrators: a *strongly
typed* network (``NetworkDefinitionCreationFlag.STRONGLY_TYPED``), whose every tensor's type
follows from the graph's own Q/DQ nodes, with no precision builder flag and no calibrator
(``explicit=True``). FP8 Q/DQ needs SM 8.9 or newer (Ada, Hopper, Blackwell such as Thor;
Orin is SM 8.7 and has no FP8): elsewhere :class:`EngineUnavailable` says so.

TensorRT ships with JetPack on Jetson; it cannot be installed on every machine (not on our CI
machines): it is imported lazily and its absence is a clear :class:`EngineUnavailable`.
"""

from __future__ import annotations

import json
import platform
import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.precision import FP32, precision_variant
from robo_pipe.errors import RoboPipeError


class EngineUnavailable(RoboPipeError, RuntimeError):
    """The engine cannot run here (package or hardware missing); the message says what to do."""


class EngineError(RoboPipeError, RuntimeError):
    """An engine failed to build, load, pass its preflight, or run."""


class InferenceEngine(ABC):
    """Runs one exported policy graph: named numpy inputs -> named numpy outputs."""

    name: str
    precision: str
    input_names: list[str]
    output_names: list[str]

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """One inference; ``feeds`` holds every input (batch-first arrays)."""

    @abstractmethod
    def describe(self) -> dict[str, str]:
        """Engine, precision, hardware and software versions (for latency reports)."""


class OnnxRuntimeEngine(InferenceEngine):
    """ONNX Runtime with the first available provider of ``providers`` (CPU always works)."""

    def __init__(
        self,
        onnx_path: str | Path,
        providers: tuple[str, ...] = ("CPUExecutionProvider",),
        threads: int = 1,
        precision: str = "fp32",
    ) -> None:
        """``precision``: what the graph at ``onnx_path`` computes in (an ``int8`` variant's
        Q/DQ graph runs as it is; ONNX Runtime has no precision switch of its own)."""
        import onnxruntime as ort

        available = ort.get_available_providers()
        chosen = [p for p in providers if p in available] or ["CPUExecutionProvider"]
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        try:
            self.session = ort.InferenceSession(str(onnx_path), options, providers=chosen)
        except Exception as err:  # ORT raises its own exception types for corrupt files
            raise EngineError(f"{onnx_path}: ONNX Runtime cannot load it: {err}") from err
        self.name = f"onnxruntime:{self.session.get_providers()[0]}"
        self.precision = precision
        self.threads = threads
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = self.session.run(self.output_names, feeds)
        return dict(zip(self.output_names, outputs, strict=True))

    def describe(self) -> dict[str, str]:
        import onnxruntime as ort

        return {
            "engine": self.name,
            "precision": self.precision,
            "threads": str(self.threads),
            "onnxruntime": ort.__version__,
            "cpu": platform.processor() or platform.machine(),
            "os": platform.platform(),
        }


class SlowedEngine(InferenceEngine):
    """``inner`` on a slower device, played on this one: each inference sleeps ``added_ms``
    first (a target profile's ``added_inference_ms``: a what-if of slower hardware, and the
    tests' slower device; never set on a real device's profile)."""

    def __init__(self, inner: InferenceEngine, added_ms: float) -> None:
        self.inner, self.added_s = inner, added_ms / 1000.0
        self.name, self.precision = inner.name, inner.precision
        self.input_names, self.output_names = inner.input_names, inner.output_names

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        time.sleep(self.added_s)
        return self.inner.run(feeds)

    def describe(self) -> dict[str, str]:
        return {**self.inner.describe(), "added_inference_ms": f"{self.added_s * 1000:g}"}


def import_tensorrt() -> Any:
    """The ``tensorrt`` module, or :class:`EngineUnavailable` saying why it is missing."""
    try:
        import tensorrt
    except (ImportError, OSError) as err:
        raise EngineUnavailable(
            f"TensorRT is not available here ({err}). It ships with JetPack on Jetson and with "
            "NVIDIA's TensorRT packages on GPU machines (pip install '.[tensorrt]' where "
            "NVIDIA's index is reachable); use the onnxruntime engine otherwise "
            "(target profile engine: onnxruntime)."
        ) from err
    return tensorrt


def plan_matches(plan: Path, key: dict[str, str]) -> bool:
    """Whether a serialised TensorRT plan exists and was built for exactly ``key`` (GPU, SM,
    TensorRT, CUDA, precision): engines are not portable, so anything else means rebuild."""
    meta = plan.with_suffix(".json")
    if not (plan.is_file() and meta.is_file()):
        return False
    try:
        return bool(json.loads(meta.read_text()) == key)
    except json.JSONDecodeError:
        return False


class TensorRTEngine(InferenceEngine):
    """A TensorRT engine built on this machine from the ONNX file (see module docstring).

    ``explicit``: the ONNX file is a precision variant whose Q/DQ nodes say the precision
    (``int8``, ``fp8``): built strongly typed, without a precision flag or a calibrator.
    Otherwise ``precision`` ``fp16`` sets the FP16 builder flag on the FP32 graph (when the GPU
    has fast FP16), anything else builds it in FP32."""

    def __init__(
        self,
        onnx_path: str | Path,
        precision: str = "fp16",
        max_batch: int = 1,
        reference: dict[str, np.ndarray] | None = None,
        tolerance: float = 2e-2,
        explicit: bool = False,
    ) -> None:
        trt = import_tensorrt()
        import torch

        if not torch.cuda.is_available():
            raise EngineUnavailable("TensorRT needs a CUDA GPU; none is visible here")
        self._trt, self._torch = trt, torch
        self.onnx_path = Path(onnx_path)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.explicit = explicit
        kind = precision_variant(precision)
        if explicit:
            sm = torch.cuda.get_device_capability()
            if kind.min_sm is not None and tuple(sm) < kind.min_sm:
                raise EngineUnavailable(
                    f"{precision.upper()} needs a GPU of SM {kind.min_sm[0]}.{kind.min_sm[1]} "
                    f"or newer (Ada, Hopper, Blackwell/Thor); {torch.cuda.get_device_name()} "
                    f"is SM {sm[0]}.{sm[1]} {kind.refusal}"
                )
            self.precision = precision
        elif kind.builder_flag is not None and not hasattr(trt.BuilderFlag, kind.builder_flag):
            raise EngineUnavailable(
                f"TensorRT {trt.__version__} has no {kind.builder_flag} builder flag (TensorRT "
                f"11 builds only strongly typed networks): an {precision.upper()} engine needs "
                f"an {precision.upper()} variant of the graph in the bundle (NVIDIA ModelOpt "
                "AutoCast), or a TensorRT 10 target"
            )
        else:
            builder = trt.Builder(self.logger)
            fast = kind.builder_flag is not None and getattr(
                builder, f"platform_has_fast_{precision}", True
            )
            self.precision = precision if fast else FP32.name
        self.max_batch = max_batch
        self.key = self.engine_key()
        plan = self.onnx_path.with_name(f"{self.onnx_path.stem}.{self._key_slug()}.plan")
        if not plan_matches(plan, self.key):  # built elsewhere (GPU, TensorRT, CUDA): rebuild
            plan.write_bytes(self._build())
            plan.with_suffix(".json").write_text(json.dumps(self.key, indent=1))
        self.engine = trt.Runtime(self.logger).deserialize_cuda_engine(plan.read_bytes())
        if self.engine is None:
            raise EngineError(f"{plan}: TensorRT could not deserialise the engine")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        mode = trt.TensorIOMode.INPUT
        self.input_names = [n for n in names if self.engine.get_tensor_mode(n) == mode]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) != mode]
        self.name = "tensorrt"
        self.stream = torch.cuda.Stream()
        if reference is not None:
            self.preflight(reference, tolerance)

    def engine_key(self) -> dict[str, str]:
        """What a serialised engine is only valid for."""
        torch = self._torch
        major, minor = torch.cuda.get_device_capability()
        return {
            "gpu": torch.cuda.get_device_name(),
            "sm": f"{major}{minor}",
            "tensorrt": self._trt.__version__,
            "cuda": str(torch.version.cuda),
            "precision": self.precision,
            "max_batch": str(self.max_batch),
            "typing": "strong" if self.explicit else "weak",
        }

    def _key_slug(self) -> str:
        k = self.key
        gpu = "".join(c if c.isalnum() else "-" for c in k["gpu"])
        return f"{gpu}-sm{k['sm']}-trt{k['tensorrt']}-cuda{k['cuda']}-{k['precision']}"

    def _build(self) -> bytes:
        trt = self._trt
        builder = trt.Builder(self.logger)
        # Explicit batch is the only mode in TensorRT 10. A Q/DQ variant is strongly typed:
        # its types come from the graph (the Q/DQ nodes), never from builder flags.
        flags = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if self.explicit else 0
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self.logger)
        if not parser.parse_from_file(str(self.onnx_path)):
            errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
            raise EngineError(f"{self.onnx_path}: TensorRT cannot parse it: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, 1 << 30)
        flag = precision_variant(self.precision).builder_flag
        if flag is not None and not self.explicit:  # strongly typed: no flags allowed
            config.set_flag(getattr(trt.BuilderFlag, flag))
        profile = builder.create_optimization_profile()
        for i in range(network.num_inputs):
            tensor = network.get_input(i)
            rest = tuple(tensor.shape)[1:]
            profile.set_shape(
                tensor.name, (1, *rest), (self.max_batch, *rest), (self.max_batch, *rest)
            )
        config.add_optimization_profile(profile)
        serialized = builder.build_serialized_network(network, config)
        if serialized is None:
            raise EngineError(f"{self.onnx_path}: TensorRT failed to build an engine")
        return bytes(serialized)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        inputs = {
            n: torch.from_numpy(np.ascontiguousarray(feeds[n])).cuda() for n in self.input_names
        }
        for name, tensor in inputs.items():
            self.context.set_input_shape(name, tuple(tensor.shape))
            self.context.set_tensor_address(name, tensor.data_ptr())
        outputs = {}
        for name in self.output_names:
            shape = tuple(self.context.get_tensor_shape(name))
            outputs[name] = torch.empty(shape, dtype=torch.float32, device="cuda")
            self.context.set_tensor_address(name, outputs[name].data_ptr())
        if not self.context.execute_async_v3(self.stream.cuda_stream):
            raise EngineError("TensorRT execution failed")
        self.stream.synchronize()
        return {n: t.cpu().numpy() for n, t in outputs.items()}

    def preflight(self, reference: dict[str, np.ndarray], tolerance: float) -> None:
        """The reference inputs must reproduce the ONNX reference outputs within ``tolerance``."""
        feeds = {n: reference[n][: self.max_batch] for n in self.input_names}
        got = self.run(feeds)
        for name in self.output_names:
            want = reference[f"expected_{name}"][: self.max_batch]
            error = float(np.abs(got[name] - want).max())
            if not error <= tolerance:
                raise EngineError(f"preflight: output {name} differs from the reference by {error}")

    def describe(self) -> dict[str, str]:
        return {"engine": self.name, **self.key, "os": platform.platform()}


def make_engine(
    onnx_path: str | Path,
    engine: str = "onnxruntime",
    precision: str = "fp32",
    threads: int = 1,
    reference: dict[str, np.ndarray] | None = None,
    explicit: bool = False,
    tolerance: float = 2e-2,
) -> InferenceEngine:
    """The engine a target profile asks for: ``onnxruntime`` or ``tensorrt``. ``explicit``:
    the file is a precision variant (Q/DQ graph) of ``precision``; ``tolerance``: TensorRT's
    preflight against the reference outputs."""
    if engine == "onnxruntime":
        providers = ("TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider")
        return OnnxRuntimeEngine(onnx_path, providers, threads, precision if explicit else "fp32")
    if engine == "tensorrt":
        return TensorRTEngine(
            onnx_path, precision, reference=reference, tolerance=tolerance, explicit=explicit
        )
    raise EngineError(f"unknown engine {engine!r}; valid choices: onnxruntime, tensorrt")
