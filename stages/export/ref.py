"""What the export stage hands on (:class:`ExportRef`), and an export already at the output
path, reused when it is one of the very checkpoint asked for (:func:`existing_export`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from deploy_edge.bundle.files import model_files, model_hash, verify_bundle
from deploy_edge.bundle.io_spec import IOSpec, IOSpecError, Variant, read_io_spec
from deploy_edge.bundle.layout import IO_SPEC_FILE, ONNX_FILE
from robo_pipe.home import unmark_home
from robo_pipe.integrity import FileSum, IntegrityError, file_sums
from robo_pipe.records import Record
from stages.export.config import ExportConfig
from stages.export.variants import variant_maker

OPSET = 18
"""The ONNX opset the graphs are exported at (an export of another is made again)."""


@dataclass(frozen=True)
class ExportRef(Record):
    """What the export stage hands on (a record: ``to_json`` / ``from_json``)."""

    path: str
    """Export directory."""
    onnx: str
    onnx_hash: str
    """sha256 over the ONNX file and its external data."""
    checkpoint: str
    checkpoint_hash: str
    parity_max_abs_error: float
    """Largest |ONNX Runtime - torch| over all parity inputs, robot units."""
    parity: dict[str, float]
    """The same per input set: ``random`` and, when a dataset was given, ``dataset``."""
    opset: int
    parameters: int = 0
    """Parameters of the exported policy (LoRA merged)."""
    random_weights: bool = False
    """Built with random weights (systems measurements only)."""
    export_seconds: float = 0.0
    """Wall time of the export, s (graph, parity, variants and their scoring)."""
    export_peak_rss_mb: float = 0.0
    """Peak resident memory of the exporting process, MiB."""
    variants: tuple[Variant, ...] = ()
    """The precision variants written beside the FP32 graph, with their figures (the spec's)."""
    note: str = ""
    """Why no variant was made although the config asked for some ("" otherwise)."""
    instruction_onnx: str = ""
    """The instruction graph, run once per episode (``policy.type: pretrained``); "" when the
    policy graph takes the tokens itself."""
    instruction_parity: float = 0.0
    """The instruction graph's largest |ONNX Runtime - torch| of the features."""


def onnx_hash(directory: Path, sums: Mapping[str, FileSum] | None = None) -> str:
    """sha256 over ``policy.onnx`` and its external data file (names and sha256s); from
    ``sums`` (the bundle's verified entries) when given, instead of reading the files again."""
    if sums is None:
        sums = file_sums(directory, model_files(directory, ONNX_FILE))
    return model_hash(sums, ONNX_FILE)


def existing_export(
    out: Path,
    source_hash: str,
    control_hz: float,
    parity_inputs: set[str],
    tolerance: float,
    wanted: list[str],
    config: ExportConfig,
) -> ExportRef | None:
    """The export at ``out`` if it is a complete one of the checkpoint with ``source_hash``,
    made for ``control_hz`` with parity measured on ``parity_inputs`` within ``tolerance``,
    with the ``wanted`` variants made and scored as ``config`` says, and verifies; None when
    there is none (or it must be made again)."""
    if not (out / IO_SPEC_FILE).is_file():
        return None
    try:
        spec = read_io_spec(out)
        if (
            spec.checkpoint_hash != source_hash
            or spec.control_hz != control_hz
            or set(spec.parity) != parity_inputs
            or spec.parity_max_abs_error > tolerance
            or spec.opset != OPSET
            or spec.onnx_file != ONNX_FILE
            or spec.lora != config.lora
            or not _same_variants(spec, wanted, config)
        ):
            return None
        sums = verify_bundle(out)
    except (IOSpecError, IntegrityError):  # incomplete or changed: replaced by a fresh export
        return None
    return export_ref(out, spec, sums)


def _same_variants(spec: IOSpec, wanted: list[str], config: ExportConfig) -> bool:
    """Whether ``spec``'s variants are the ``wanted`` ones, made with the settings ``config``
    gives each (its maker's ``settings``: frames, error bar, what stays in float, ...)."""
    if [v.name for v in spec.variants] != wanted:
        return False
    return all(
        v.calibration.get(key) == value
        for v in spec.variants
        for key, value in variant_maker(v.name).settings(config).items()
    )


def export_ref(out: Path, spec: IOSpec, sums: Mapping[str, FileSum]) -> ExportRef:
    return ExportRef(
        path=str(out),
        onnx=str(out / ONNX_FILE),
        onnx_hash=onnx_hash(out, sums),
        checkpoint=unmark_home(spec.checkpoint),
        checkpoint_hash=spec.checkpoint_hash,
        parity_max_abs_error=spec.parity_max_abs_error,
        parity=dict(spec.parity),
        opset=spec.opset,
        parameters=spec.parameters,
        random_weights=spec.random_weights,
        export_seconds=spec.export_seconds,
        export_peak_rss_mb=spec.export_peak_rss_mb,
        variants=spec.variants,
        instruction_onnx=(
            "" if spec.instruction_graph is None else str(out / spec.instruction_graph.onnx_file)
        ),
        instruction_parity=(
            0.0 if spec.instruction_graph is None else spec.instruction_graph.parity_max_abs_error
        ),
    )
