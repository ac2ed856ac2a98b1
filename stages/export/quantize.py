"""Precision variants of an exported graph: made from the FP32 ONNX file, scored against it.

    split_frames   = the training dataset's episodes in two: frames to calibrate on, and
                     held-out frames (other episodes) to score on, never the same
    quantize_int8  = ONNX Runtime static quantisation of the graph's learned layers (Conv,
                     MatMul, Gemm with a weight matrix): QDQ format, per-channel symmetric INT8
                     weights, symmetric INT8 activations (zero point 0) calibrated (MinMax) on
                     the calibration frames; the rest stays FP32
    INT8           = the INT8 variant's maker (:data:`~stages.export.config.MAKERS`):
                     quantize_int8 writes it, int8_variant its spec entry of its scores
    score_variant  = the variant against FP32 ONNX Runtime on the held-out frames (robot units,
                     and relative to each action dimension's std in the training data), against
                     torch on the bundle's reference inputs, and the error bar's verdict

Why symmetric activations and QDQ: the same file is what a TensorRT target builds its INT8
engine from, explicitly (TensorRT 10 reads Q/DQ pairs and wants zero points of 0; its implicit
calibrators are deprecated); ONNX Runtime's CPU kernels run the same graph. Why per-channel
weights: a transformer's linear layers differ by orders of magnitude between output channels,
and one scale per tensor loses the small ones. Why only layers with a weight matrix: that is
where the time and the memory are; ONNX Runtime's default (Q/DQ around every Add, Mul,
Softmax, LayerNorm...) put the demo's VLA at 107% of an action std. A MatMul with a constant
vector is a fixed reduction (the spatial softmax's expected coordinates, 14% alone), not a
layer, and stays FP32; so do layers ``export.keep_float`` names.
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.bundle.io_spec import Variant
from robo_pipe.errors import RoboPipeError
from robo_pipe.home import mark_home
from stages.export.config import ExportConfig
from stages.export.variants import Errors, FrameSplit, VariantMaker

CALIBRATE_METHOD = "MinMax"
"""How activation ranges are taken from the calibration frames: their min and max,
symmetrised (the ranges a TensorRT explicit-quantisation graph carries)."""
CALIBRATION_BATCH = 1
"""Frames per calibration run. The calibrating session holds a run's activations: at the
SmolVLM-256M preset's 512 px each frame in a run added ~1 GiB (measured with ONNX Runtime's own
calibrating session: 4 frames 11.6 GiB peak, 1 frame 7.3 GiB, in 22-24 s either way)."""
SCORE_BATCH = 2
"""Frames per scoring run (one session at a time holds its activations)."""
INT8_METHOD = (
    "onnxruntime quantize_static: QDQ, per-channel symmetric int8 weights, "
    f"symmetric int8 activations ({CALIBRATE_METHOD} calibration)"
)
UINT8_METHOD = (
    "onnxruntime quantize_static: QDQ, per-channel symmetric int8 weights, "
    f"asymmetric uint8 activations ({CALIBRATE_METHOD} calibration; not for TensorRT)"
)


class QuantizeError(RoboPipeError, ValueError):
    """A variant cannot be made from this dataset (too few episodes or frames to set some
    apart for scoring)."""


def split_frames(policy: Any, root: Path, calibration_frames: int, score_frames: int) -> FrameSplit:
    """``calibration_frames`` frames spread over most of the dataset's episodes and
    ``score_frames`` spread over the others (every fourth episode, at least one), as the
    graph's inputs: images, states and tokenized instructions.

    Raises:
        QuantizeError: fewer than two episodes (nothing could be held out)."""
    from stages.dataset.layout import STATE_KEY
    from stages.dataset.reader import open_dataset

    dataset = open_dataset(root)
    frames = dataset.frames()
    episode_of = frames["episode_index"].astype(int)
    episodes = sorted(set(episode_of.tolist()))
    if len(episodes) < 2:
        raise QuantizeError(
            f"{root}: {len(episodes)} episode(s): a precision variant needs at least 2 (frames "
            "to calibrate on and held-out frames of other episodes to score on); collect more "
            "or set export.variants=[]"
        )
    # Every fourth episode is held out: spread over the collection, whatever its order.
    scoring = episodes[3::4] or episodes[-1:]
    calibration = [e for e in episodes if e not in scoring]
    images = {c: dataset.camera_frames(c) for c in policy.cfg.cameras}

    def inputs(chosen: list[int], n: int) -> dict[str, np.ndarray]:
        where = np.flatnonzero(np.isin(episode_of, chosen))
        idx = np.unique(where[np.linspace(0, len(where) - 1, min(n, len(where))).astype(int)])
        out = {f"image_{c}": images[c][idx] for c in policy.cfg.cameras}
        out["state"] = frames[STATE_KEY][idx].astype(np.float32)
        texts = [dataset.tasks[int(t)] for t in frames["task_index"][idx]]
        out["tokens"], out["token_mask"] = policy.tokenizer(texts)
        return out

    return FrameSplit(
        calibration=inputs(calibration, calibration_frames),
        scoring=inputs(scoring, score_frames),
        calibration_episodes=calibration,
        scoring_episodes=scoring,
        dataset=str(Path(root).resolve()),
    )


class _Reader:
    """ONNX Runtime's calibration data reader over a dict of batched inputs."""

    def __init__(self, inputs: Mapping[str, np.ndarray], batch: int) -> None:
        self.inputs = inputs
        self.batch = batch
        self.frames = len(next(iter(inputs.values())))
        self.runs: Iterator[dict[str, np.ndarray]] = iter(self._batches())

    def _batches(self) -> list[dict[str, np.ndarray]]:
        return [
            {k: v[i : i + self.batch] for k, v in self.inputs.items()}
            for i in range(0, self.frames, self.batch)
        ]

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.runs, None)

    def rewind(self) -> None:
        self.runs = iter(self._batches())


QUANTIZED_OPS = ("Conv", "MatMul", "Gemm")
"""Operators quantised, when their weight (second input) is a constant matrix."""


def layers_to_quantize(fp32: Path, keep_float: list[str]) -> list[str]:
    """Names of the nodes of ``fp32`` to quantise: :data:`QUANTIZED_OPS` whose second input
    is an initializer of rank 2 or more, unless its name matches a ``keep_float`` pattern."""
    import onnx

    model = onnx.load(str(fp32), load_external_data=False)  # shapes only: no weights read
    ranks = {i.name: len(i.dims) for i in model.graph.initializer}
    kept = [re.compile(p) for p in keep_float]
    return [
        node.name
        for node in model.graph.node
        if node.op_type in QUANTIZED_OPS
        and len(node.input) > 1
        and ranks.get(node.input[1], 0) >= 2
        and not any(k.search(node.input[1]) for k in kept)
    ]


def quantize_int8(
    fp32: Path,
    out: Path,
    calibration: Mapping[str, np.ndarray],
    external_data: bool,
    layers: list[str],
    config: ExportConfig,
) -> float:
    """Write ``out`` (and ``out`` + ``.data`` when ``external_data``: graphs past 2 GB must
    keep their weights outside the protobuf), the static INT8 Q/DQ variant of the FP32 graph
    ``fp32`` with the nodes ``layers`` quantised, calibrated on ``calibration``; activations
    INT8 with zero point 0 (``export.int8_activations`` ``symmetric``) or UINT8 with a zero
    point. Returns the seconds it took."""
    from onnxruntime.quantization import (
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    from stages.export.graph import quiet  # torch's import: only where an export runs

    symmetric = config.int8_activations == "symmetric"
    start = time.perf_counter()
    # The quantizer logs a line per tensor it leaves in float (the integer inputs, shapes).
    with quiet(""), tempfile.TemporaryDirectory(dir=out.parent, prefix=".calibration.") as tmp:
        ranges = calibrate(fp32, calibration, Path(tmp), external_data)
        quantize_static(
            str(fp32),
            str(out),
            None,  # the ranges are calibrated above, with bounded memory
            calibration_cache_path=ranges,
            quant_format=QuantFormat.QDQ,
            op_types_to_quantize=list(QUANTIZED_OPS),
            nodes_to_quantize=layers,
            per_channel=True,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            calibrate_method=CalibrationMethod.MinMax,
            use_external_data_format=external_data,
            extra_options={
                # Zero points of 0 on both sides: TensorRT's explicit quantisation needs them.
                "ActivationSymmetric": symmetric,
                "WeightSymmetric": True,
                # Not CalibMaxIntermediateOutputs: in onnxruntime 1.31 it drops the runs it
                # clears instead of merging their ranges ("No data is collected"). MinMax keeps
                # only each tensor's reduced min and max per run, so memory stays small anyway.
            },
        )
    for written in out.parent.glob(f"{out.name}*"):
        written.chmod(0o644)  # the quantizer writes its external data owner-only
    return time.perf_counter() - start


def calibrate(
    fp32: Path, calibration: Mapping[str, np.ndarray], scratch: Path, external_data: bool
) -> Path:
    """Each quantised layer's input ranges (min and max) over the ``calibration`` frames,
    written as ONNX Runtime's calibration cache in ``scratch``: what ``quantize_static`` would
    calibrate itself (the same ranges, tested), in bounded memory.

    ONNX Runtime's calibrating session adds a ReduceMin and a ReduceMax output per tensor and
    runs in its default order, which computes the whole graph before any of them: every
    calibrated activation of a frame is alive at once (+4.3 GiB at the 256 M preset, 7.3 GiB
    peak), and it keeps the augmented graph in memory beside its session (the weights twice
    more). Here the augmented graph is read from disk alone and run in priority order, each
    reduction as soon as its tensor exists (+0.8 GiB)."""
    import onnxruntime as ort
    from onnxruntime.quantization.calibrate import MinMaxCalibrater, save_tensors_data

    calibrator = MinMaxCalibrater(
        str(fp32),
        list(QUANTIZED_OPS),
        str(scratch / "augmented.onnx"),
        use_external_data_format=external_data,
    )
    calibrator.augment_graph()  # written to the scratch folder
    calibrator.model = None  # its weights are on disk now; nothing after this reads them
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as ORT does
    options.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    options.add_session_config_entry("session.disable_prepacking", "1")  # a few runs only
    calibrator.infer_session = ort.InferenceSession(
        calibrator.augmented_model_path, options, providers=["CPUExecutionProvider"]
    )
    calibrator.collect_data(_Reader(calibration, CALIBRATION_BATCH))
    ranges = scratch / "ranges.json"
    save_tensors_data(calibrator.compute_data(), ranges)
    return ranges


def fp32_actions(fp32: Any, held_out: Mapping[str, np.ndarray]) -> np.ndarray:
    """The FP32 graph's actions ``(frames, chunk, action_dim)`` on the held-out inputs (an ONNX
    Runtime session ``fp32``): what each variant is scored against, computed once, so that no
    two graphs need to be in memory together."""
    frames = len(held_out["state"])
    return np.concatenate(
        [
            fp32.run(["actions"], {k: v[i : i + SCORE_BATCH] for k, v in held_out.items()})[0]
            for i in range(0, frames, SCORE_BATCH)
        ]
    )


def score_variant(
    variant: Any,
    fp32: np.ndarray,
    held_out: Mapping[str, np.ndarray],
    action_std: np.ndarray,
    reference: Mapping[str, np.ndarray],
    output_names: list[str],
) -> Errors:
    """``variant`` (an ONNX Runtime session) on the held-out inputs against the FP32 graph's
    actions on them (``fp32``, :func:`fp32_actions`): mean and largest |variant - FP32| of the
    actions (robot units) and the worst dimension's mean error over its std in the training
    data (``action_std``, the policy's normalizer's); and the largest |variant - torch| over
    every output on the bundle's ``reference`` inputs (``expected_<output>`` there), which
    device parity checks hold the variant to."""
    frames = len(held_out["state"])
    got = [
        variant.run(["actions"], {k: v[i : i + SCORE_BATCH] for k, v in held_out.items()})[0]
        for i in range(0, frames, SCORE_BATCH)
    ]
    diff = np.abs(np.concatenate(got) - fp32)  # (frames, chunk, action_dim)
    by_dim = diff.reshape(-1, diff.shape[-1]).mean(axis=0) / np.asarray(action_std)
    # The graph's own inputs (a policy graph fed by an instruction graph takes no tokens).
    feeds = {i.name: reference[i.name] for i in variant.get_inputs()}
    outputs = variant.run(output_names, feeds)
    reference_error = max(
        float(np.abs(o - reference[f"expected_{name}"]).max())
        for o, name in zip(outputs, output_names, strict=True)
    )
    return Errors(
        action_error=float(diff.mean()),
        action_error_max=float(diff.max()),
        relative_error=float(by_dim.max()),
        relative_by_dim=[float(v) for v in by_dim],
        reference_error=reference_error,
        scored_frames=frames,
    )


def int8_variant(
    onnx_file: str,
    errors: Errors,
    split: FrameSplit,
    config: ExportConfig,
    seconds: float,
    layers: int,
) -> Variant:
    """The spec entry of an INT8 variant scored as ``errors``: a candidate only within
    ``config.max_relative_error`` (the reason names the dimension and both figures
    otherwise). ``calibration`` records the frames asked for too (an export is reused only
    for the same settings)."""
    max_relative_error = config.max_relative_error
    over = errors.relative_error > max_relative_error
    worst = int(np.argmax(errors.relative_by_dim))
    reason = (
        f"action error {errors.relative_error:.1%} of action dim {worst}'s std on "
        f"{errors.scored_frames} held-out frames, over the error bar "
        f"(export.max_relative_error {max_relative_error:.1%})"
        if over
        else ""
    )
    return Variant(
        name="int8",
        precision="int8",
        onnx_file=onnx_file,
        method=INT8_METHOD if config.int8_activations == "symmetric" else UINT8_METHOD,
        calibration={
            "dataset": mark_home(split.dataset),
            "frames": len(split.calibration["state"]),
            "episodes": len(split.calibration_episodes),
            "scoring_episodes": len(split.scoring_episodes),
            "held_out": "every 4th episode (by index) is scored, the others calibrate",
            "method": "static",
            "calibrate_method": CALIBRATE_METHOD,
            "requested_frames": config.calibration_frames,
            "requested_score_frames": config.score_frames,
            "max_relative_error": max_relative_error,
            "quantized_layers": layers,
            "activations": config.int8_activations,
            "keep_float": list(config.keep_float),
            "relative_error_by_dim": [round(v, 6) for v in errors.relative_by_dim],
            "seconds": round(seconds, 2),
        },
        action_error=errors.action_error,
        action_error_max=errors.action_error_max,
        relative_error=errors.relative_error,
        reference_error=errors.reference_error,
        scored_frames=errors.scored_frames,
        candidate=not over,
        reason=reason,
    )


def int8_settings(config: ExportConfig) -> dict[str, Any]:
    """What an INT8 variant is made with, as :func:`int8_variant` records it."""
    return {
        "max_relative_error": config.max_relative_error,
        "requested_frames": config.calibration_frames,
        "requested_score_frames": config.score_frames,
        "keep_float": list(config.keep_float),
        "activations": config.int8_activations,
    }


INT8 = VariantMaker(
    name="int8", precision="int8", make=quantize_int8, spec=int8_variant, settings=int8_settings
)
"""The INT8 Q/DQ variant's maker (:data:`~stages.export.config.MAKERS`)."""
