"""The export step: a checkpoint as an ONNX bundle with its precision variants."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import PipelineConfig
from pipelines.progress import SILENT, Listener, status_lines
from robo_pipe.errors import InputError
from robo_pipe.locks import output_lock

if TYPE_CHECKING:
    from stages.export import ExportRef


def export_checkpoint(
    cfg: PipelineConfig,
    checkpoint: Path,
    out: Path,
    dataset: Path | None = None,
    listener: Listener = SILENT,
) -> ExportRef:
    """Export ``checkpoint`` to an ONNX bundle at ``out`` (parity checked on random inputs and,
    with ``dataset``, on its frames), at ``cfg``'s robot's control rate, with the precision
    variants ``cfg.export`` asks for, calibrated and scored on ``dataset`` (without one: FP32
    only, and the record's ``note`` says so). One exporter per ``out`` at a time: a run that
    waited for another gets that one's export back."""
    from robots.spec import get_robot
    from stages.export import QuantizeError, export

    listener.started("export", None, "")
    with output_lock(out, "export", status_lines("export", listener)):
        try:
            return export(
                checkpoint,
                out,
                get_robot(cfg.robot).control_hz,
                cfg.seed,
                dataset=dataset,
                config=cfg.export,
            )
        except QuantizeError as err:  # a dataset too small to hold frames out: the input's
            raise InputError(str(err)) from err
