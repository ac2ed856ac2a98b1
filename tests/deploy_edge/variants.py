"""Test bundles with precision variants, made here until the export writes them: the tiny
export copied, its FP32 graph quantised by ONNX Runtime (static INT8, QDQ, per-channel
symmetric weights, symmetric activations calibrated on the bundle's reference inputs), declared
in the copy's I/O spec with the figures a test wants, and the checksums written again."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.bundle.files import write_bundle_checksums
from deploy_edge.bundle.io_spec import Variant, read_io_spec, write_io_spec
from deploy_edge.bundle.layout import ONNX_FILE, REFERENCE_FILE


def quantize_int8(bundle: Path, out: Path) -> None:
    """``bundle``'s FP32 graph as a static INT8 Q/DQ graph at ``out``."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    reference = dict(np.load(bundle / REFERENCE_FILE))
    names = read_io_spec(bundle).input_names

    class Frames(CalibrationDataReader):
        def __init__(self) -> None:
            count = len(reference[names[0]])
            self.frames: Iterator[dict[str, Any]] = iter(
                {n: reference[n][i : i + 1] for n in names} for i in range(count)
            )

        def get_next(self) -> dict[str, Any] | None:
            return next(self.frames, None)

    quantize_static(
        str(bundle / ONNX_FILE),
        str(out),
        Frames(),
        quant_format=QuantFormat.QDQ,
        per_channel=True,
        activation_type=QuantType.QInt8,
        weight_type=QuantType.QInt8,
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True},
    )


def reference_error(bundle: Path, onnx_file: str) -> float:
    """Largest |variant - torch| over ``bundle``'s reference inputs (actions)."""
    import onnxruntime as ort

    reference = dict(np.load(bundle / REFERENCE_FILE))
    session = ort.InferenceSession(str(bundle / onnx_file), providers=["CPUExecutionProvider"])
    feeds = {i.name: reference[i.name] for i in session.get_inputs()}
    (actions,) = session.run(["actions"], feeds)
    return float(np.abs(actions - reference["expected_actions"]).max())


def with_variants(source: Path, dest: Path, *variants: dict[str, Any]) -> Path:
    """A copy of the bundle ``source`` at ``dest`` with one variant per dict: ``name``,
    ``precision`` (default ``int8``), ``file``: ``quantized`` (default: ONNX Runtime's INT8 of
    the FP32 graph) or ``copy`` (the FP32 graph, its weights inside it: a variant that read the
    FP32 model's ``policy.onnx.data`` is refused in a registry copy, where that file is named
    ``model.onnx.data``), and any :class:`Variant` field to
    record (``relative_error``, ``candidate``, ``reason``, ``reference_error``...)."""
    shutil.copytree(source, dest)
    spec = read_io_spec(dest)
    made = []
    for given in variants:
        fields = dict(given)
        name = fields.pop("name")
        how = fields.pop("file", "quantized")
        onnx_file = f"policy.{name}.onnx"
        if how == "copy":  # its own file, weights inside: never the FP32 model's data file
            import onnx

            onnx.save(onnx.load(str(dest / ONNX_FILE)), str(dest / onnx_file))
        else:
            quantize_int8(dest, dest / onnx_file)
        recorded: dict[str, Any] = {
            "precision": "int8",
            "method": f"test: {how}",
            "calibration": {"frames": "reference.npz"},
            "action_error": 0.001,
            "action_error_max": 0.01,
            "relative_error": 0.01,
            "reference_error": reference_error(dest, onnx_file),
            "scored_frames": 8,
        }
        made.append(Variant(name=name, onnx_file=onnx_file, **(recorded | fields)))
    write_io_spec(dest, dataclasses.replace(spec, variants=(*spec.variants, *made)))
    write_bundle_checksums(dest)
    return dest
