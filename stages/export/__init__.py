"""The export stage: a checkpoint to an ONNX bundle usable without the training code.

``export(checkpoint, out)`` writes the bundle (its layout and I/O spec are owned by
:mod:`deploy_edge.bundle`) and returns an :class:`ExportRef`; it is implemented in
:mod:`stages.export.onnx` (parity with torch in :mod:`stages.export.parity`, the record and
the reuse of an export already there in :mod:`stages.export.ref`), its precision variants
(INT8 Q/DQ, scored against FP32) in :mod:`stages.export.quantize`, what every variant's maker
shares in :mod:`stages.export.variants`, its settings and the makers' registry
(:data:`~stages.export.config.MAKERS`) in :mod:`stages.export.config`. Names load on first
use (torch only then).
"""

from typing import TYPE_CHECKING

from stages import lazy_exports

if TYPE_CHECKING:
    from stages.export.config import ExportConfig
    from stages.export.onnx import export
    from stages.export.parity import ExportError
    from stages.export.quantize import QuantizeError
    from stages.export.ref import ExportRef, onnx_hash

__all__ = ["ExportConfig", "ExportError", "ExportRef", "QuantizeError", "export", "onnx_hash"]
__getattr__ = lazy_exports(
    __name__,
    {
        "stages.export.config": ("ExportConfig",),
        "stages.export.onnx": ("export",),
        "stages.export.parity": ("ExportError",),
        "stages.export.ref": ("ExportRef", "onnx_hash"),
        "stages.export.quantize": ("QuantizeError",),
    },
)
