"""Typed configuration of the export stage (the ``export:`` section): which precision variants
are made beside the FP32 graph, what they are calibrated and scored on, and the error bar a
variant must stay within to be a candidate."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from robo_pipe.validation import one_of

MAKERS: dict[str, str] = {
    "int8": "stages.export.quantize:INT8",
}
"""Variant the export makes on this machine -> ``module:name`` of its
:class:`~stages.export.variants.VariantMaker`, imported only when one is made. Adding one = its
module + one line here (and its :class:`~deploy_edge.precision.PrecisionVariant` in
:data:`deploy_edge.precision.VARIANTS`). FP16 and FP8 TensorRT engines are built on the device
(GPU-only) from the FP32 graph and from the INT8 graph's explicit Q/DQ nodes."""


class ExportConfig(BaseModel):
    """Precision variants of the export and how each is scored before it may ship."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    variants: list[Annotated[str, AfterValidator(one_of(MAKERS, "export variant"))]] = ["int8"]
    """Variants written beside ``policy.onnx``, keys of :data:`MAKERS` (``int8``: ONNX
    Runtime static quantisation with Q/DQ nodes, per-channel symmetric INT8 weights, symmetric
    INT8 activations calibrated on dataset frames). ``[]``: the FP32 graph only. They need the
    training dataset (calibration and scoring frames): an export without one writes FP32 only
    and says so."""
    max_relative_error: float = Field(default=0.05, gt=0.0, le=10.0)
    """The error bar: a variant whose worst action dimension's mean |variant - FP32| on the
    held-out frames exceeds this fraction of that dimension's std in the training data is not
    a candidate (kept in the bundle with the reason; never shipped to run)."""
    calibration_frames: int = Field(default=64, ge=1, le=100_000)
    """Dataset frames the activation ranges are calibrated on (spread over the calibration
    episodes)."""
    score_frames: int = Field(default=64, ge=1, le=100_000)
    """Held-out dataset frames the action error is measured on (spread over the episodes set
    apart from calibration)."""
    int8_activations: Literal["symmetric", "asymmetric"] = "symmetric"
    """``symmetric``: INT8 activations with zero point 0, the Q/DQ graph TensorRT builds an
    explicit INT8 engine from. ``asymmetric``: UINT8 activations with a zero point, what ONNX
    Runtime's x86 kernels run fastest (measured at the SmolVLM-256M preset on this machine's
    CPU: 1.63x FP32 at 1 thread and 1.48x at 2, against 1.23x and 0.98x symmetric) but not a
    graph TensorRT's explicit quantisation accepts: for CPU-only targets."""
    keep_float: list[str] = [r"\.encoders\.[^.]+\.proj\."]
    """Regular expressions on weight names (``policy.<module path>.weight``): layers whose
    weight matches stay in FP32 in the INT8 graph (mixed precision). Default: the default
    VLA's keypoint projection, whose input puts spatial-softmax coordinates (within +-1) and
    max-pooled features (tens) in one tensor that one INT8 scale cannot resolve (measured on
    the demo's VLA: 5.4% of an action std with it quantised, 2.8% without)."""
    lora: Literal["merged", "separate"] = "merged"
    """``merged``: LoRA folded into the base weights (one matmul per adapted layer).
    ``separate``: the adapters stay their own small tensors beside the base weights, which a
    fine-tune of the same base leaves byte for byte as they were, so a device that holds the
    previous release is sent only the adapters and heads (delta uploads,
    :mod:`deploy_edge.release.pieces`); it costs the adapters' two small matmuls per layer
    (measured by benchmarks/deploy.py --delta-only)."""
    score_success: bool = True
    """Also play each candidate variant on the held-out suite against the FP32 export on the
    same seeds, with the no-regression gate's paired test, during the pipeline's evaluation
    (models trained here only: a random-weights policy solves nothing, so success says
    nothing about it). Worse than FP32: not a candidate."""
