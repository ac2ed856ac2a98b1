"""The export's precision phase: the frames every variant is calibrated and scored on, taken
while the torch policy is still loaded (:func:`variant_frames`), then each variant
``export.variants`` names written by its maker and scored against the FP32 graph, one graph in
memory at a time (:func:`make_variants`). Records and makers: :mod:`stages.export.variants`;
INT8: :mod:`stages.export.quantize`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.bundle.files import model_files
from deploy_edge.bundle.io_spec import Variant
from deploy_edge.bundle.layout import ONNX_FILE
from stages.export.config import ExportConfig
from stages.export.memory import check_session, release_memory
from stages.export.quantize import fp32_actions, layers_to_quantize, score_variant, split_frames
from stages.export.variants import FrameSplit, variant_maker
from stages.policy.onnx_graph import OnnxPolicy


def variant_frames(wrapper: OnnxPolicy, dataset: Path, config: ExportConfig) -> FrameSplit:
    """The dataset frames the variants are calibrated and scored on, as the policy graph's own
    inputs: with an instruction graph, the torch features of the tokens (the instruction graph
    is not quantised). Computed while the torch policy is still loaded."""
    split = split_frames(wrapper.policy, dataset, config.calibration_frames, config.score_frames)
    return replace(
        split,
        calibration=wrapper.graph_inputs(split.calibration),
        scoring=wrapper.graph_inputs(split.scoring),
    )


def make_variants(
    split: FrameSplit,
    action_std: np.ndarray,
    staging: Path,
    reference: dict[str, Any],
    wanted: list[str],
    config: ExportConfig,
) -> tuple[Variant, ...]:
    """Each of ``wanted`` made from the staged FP32 graph, calibrated and scored on ``split``,
    written as ``policy.<name>.onnx`` (+ data) into ``staging``. One graph in memory at a
    time: FP32's actions on the scoring frames first, then each variant's session alone."""
    external = any(p.name != ONNX_FILE for p in model_files(staging, ONNX_FILE))
    layers = layers_to_quantize(staging / ONNX_FILE, config.keep_float)
    makers = [(name, variant_maker(name)) for name in wanted]  # export.variants: MAKERS' keys
    made: list[Variant] = []
    seconds: dict[str, float] = {}
    for name, maker in makers:  # all made before any is scored
        target = staging / f"policy.{name}.onnx"
        seconds[name] = maker.make(
            staging / ONNX_FILE, target, split.calibration, external, layers, config
        )
        release_memory()
    fp32 = check_session(staging / ONNX_FILE)
    baseline = fp32_actions(fp32, split.scoring)
    del fp32
    release_memory()
    for name, maker in makers:
        target = staging / f"policy.{name}.onnx"
        session = check_session(target)
        errors = score_variant(
            session, baseline, split.scoring, action_std, reference, list(OnnxPolicy.output_names)
        )
        made.append(maker.spec(target.name, errors, split, config, seconds[name], len(layers)))
        del session
        release_memory()
    return tuple(made)
