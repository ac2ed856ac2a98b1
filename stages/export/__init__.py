"""The export stage: a checkpoint to an ONNX bundle usable without the training code.

``export(checkpoint, out)`` writes the bundle (its layout and I/O spec are owned by
:mod:`deploy_edge.bundle`) and returns an :class:`ExportRef`; it is implemented in
:mod:`stages.export.onnx`. Names load on first use (torch only then).
"""

from typing import TYPE_CHECKING

from stages import lazy_exports

if TYPE_CHECKING:
    from stages.export.onnx import ExportError, ExportRef, export, onnx_hash

__all__ = ["ExportError", "ExportRef", "export", "onnx_hash"]
__getattr__ = lazy_exports(
    __name__, {"stages.export.onnx": ("ExportError", "ExportRef", "export", "onnx_hash")}
)
