"""What every precision variant the export makes shares: the maker it is made by, the frames
it is calibrated and scored on, and its errors against the FP32 graph.

    VariantMaker   = a variant's maker: its name and precision, the function that writes it
                     from the FP32 graph and the one that writes its spec entry of its scores
    variant_maker  = the maker a name in :data:`~stages.export.config.MAKERS` resolves to
    FrameSplit     = the dataset frames as graph inputs: calibration and held-out scoring
    Errors         = a variant against FP32 (held-out frames) and torch (reference inputs)

The export (:func:`stages.export.onnx.export`) makes every variant ``export.variants`` names
alike (:func:`stages.export.precisions.make_variants`): each maker writes its file, then each
is scored against FP32 (:func:`stages.export.quantize.score_variant`) and its maker writes its
spec entry. INT8:
:data:`stages.export.quantize.INT8`.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.bundle.io_spec import Variant
from stages.export.config import MAKERS, ExportConfig


@dataclass(frozen=True)
class VariantMaker:
    """How one precision variant is made from the FP32 graph and listed in the spec."""

    name: str
    """The variant's name (``policy.<name>.onnx``; a key of :data:`MAKERS`)."""
    precision: str
    """The precision it runs in: a key of :data:`deploy_edge.precision.VARIANTS`."""
    make: Callable[[Path, Path, Mapping[str, np.ndarray], bool, list[str], ExportConfig], float]
    """``(fp32, out, calibration, external_data, layers, config)``: write ``out`` (and ``out``
    + ``.data`` when ``external_data``) from the FP32 graph ``fp32``, its learned ``layers``
    (``export.keep_float`` left out) in this precision, calibrated on ``calibration``; returns
    the seconds it took."""
    spec: Callable[[str, Errors, FrameSplit, ExportConfig, float, int], Variant]
    """``(onnx_file, errors, split, config, seconds, layers)``: the spec entry of the variant
    ``onnx_file`` scored as ``errors``, a candidate only within ``config.max_relative_error``."""
    settings: Callable[[ExportConfig], dict[str, Any]]
    """The export settings the variant is made with, as its spec entry's ``calibration``
    records them: an earlier export is reused only when every one is the same."""


def variant_maker(name: str) -> VariantMaker:
    """The maker of variant ``name``: the one :data:`MAKERS` names for it."""
    maker: VariantMaker = pkgutil.resolve_name(MAKERS[name])
    return maker


@dataclass(frozen=True)
class FrameSplit:
    """Dataset frames as graph inputs, in two disjoint sets of episodes."""

    calibration: dict[str, np.ndarray]
    """Inputs the activation ranges are calibrated on."""
    scoring: dict[str, np.ndarray]
    """Held-out inputs the variants are scored on (other episodes)."""
    calibration_episodes: list[int]
    scoring_episodes: list[int]
    dataset: str
    """The dataset's path."""


@dataclass(frozen=True)
class Errors:
    """A variant against its references."""

    action_error: float
    action_error_max: float
    relative_error: float
    relative_by_dim: list[float]
    """Each action dimension's mean |variant - FP32| over its training std."""
    reference_error: float
    scored_frames: int
