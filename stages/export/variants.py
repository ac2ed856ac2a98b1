"""What every precision variant the export makes shares: the maker it is made by, the frames
it is calibrated and scored on, and its errors against the FP32 graph.

    VariantMaker   = the base of a variant's maker (its name and precision; how it is written
                     from the FP32 graph and how its spec entry reads its scores)
    variant_maker  = the maker a name in :data:`~stages.export.config.MAKERS` resolves to
    FrameSplit     = the dataset frames as graph inputs: calibration and held-out scoring
    Errors         = a variant against FP32 (held-out frames) and torch (reference inputs)

The export (:func:`stages.export.onnx.export`) makes every variant ``export.variants`` names
alike: each maker writes its file, then each is scored against FP32
(:func:`stages.export.quantize.score_variant`) and its maker writes its spec entry. INT8:
:class:`stages.export.quantize.Int8Maker`.
"""

from __future__ import annotations

import pkgutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from deploy_edge.bundle.io_spec import Variant
from stages.export.config import MAKERS, ExportConfig


class VariantMaker:
    """How one precision variant is made from the FP32 graph and listed in the spec."""

    name: ClassVar[str]
    """The variant's name (``policy.<name>.onnx``; a key of :data:`MAKERS`)."""
    precision: ClassVar[str]
    """The precision it runs in: a key of :data:`deploy_edge.precision.VARIANTS`."""

    def make(
        self,
        fp32: Path,
        out: Path,
        calibration: Mapping[str, np.ndarray],
        external_data: bool,
        layers: list[str],
        config: ExportConfig,
    ) -> float:
        """Write ``out`` (and ``out`` + ``.data`` when ``external_data``) from the FP32 graph
        ``fp32``, its learned ``layers`` (``export.keep_float`` left out) in this precision,
        calibrated on ``calibration``. Returns the seconds it took."""
        raise NotImplementedError

    def spec(
        self,
        onnx_file: str,
        errors: Errors,
        split: FrameSplit,
        config: ExportConfig,
        seconds: float,
        layers: int,
    ) -> Variant:
        """The spec entry of the variant ``onnx_file`` scored as ``errors``, a candidate only
        within ``config.max_relative_error``."""
        raise NotImplementedError


def variant_maker(name: str) -> VariantMaker:
    """The maker of variant ``name``: the class :data:`MAKERS` names for it."""
    maker: type[VariantMaker] = pkgutil.resolve_name(MAKERS[name])
    return maker()


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
