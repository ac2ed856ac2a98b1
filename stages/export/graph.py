"""One export wrapper (:mod:`stages.policy.onnx_graph`) as an ONNX file: traced, a dynamic batch
axis, its weights in one external-data file beside it, checked. :mod:`stages.export.onnx` calls
it for the policy graph and the instruction graph."""

from __future__ import annotations

import logging
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from stages.export.ref import OPSET
from stages.policy.onnx_graph import OnnxInstructionEncoder, OnnxPolicy


def export_graph(
    module: OnnxPolicy | OnnxInstructionEncoder, example: tuple[torch.Tensor, ...], path: Path
) -> None:
    """An export wrapper as an ONNX file at ``path``, its weights in external data
    (``<name>.data``), a dynamic batch axis on every input and output; checked.

    The TorchScript exporter, not dynamo: the wrappers are straight-line graphs (no
    data-dependent control flow; token length and chunk length are fixed, only the batch
    varies), which tracing captures exactly, and parity against torch is measured on every
    export. Dynamo took 8 s for a tiny policy where tracing takes 0.2 s (every pipeline run
    exports once), and about ten times the FP32 weights in memory at 256 M.
    """
    import onnx

    with tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.") as scratch:
        # Traced into a scratch folder (a graph past 2 GB needs its weights in files beside
        # it: the 1 B preset's 4.7 GB took about a minute); the bundle gets the one
        # external-data file written below.
        traced = Path(scratch) / path.name
        # The exporter puts the whole module tree back in its root's mode afterwards: a root
        # left in training mode (a fresh wrapper) would turn dropout on for the parity check.
        module.eval()
        inputs, outputs = list(module.input_names), list(module.output_names)
        # The exporter's chatter (TracerWarnings on shape arithmetic that is constant here,
        # its own deprecation notice) is not ours.
        with warnings.catch_warnings(), quiet("torch.onnx"):
            warnings.simplefilter("ignore", category=UserWarning)
            warnings.simplefilter("ignore", category=DeprecationWarning)
            warnings.simplefilter("ignore", category=torch.jit.TracerWarning)
            torch.onnx.export(
                module,
                example,
                str(traced),
                input_names=inputs,
                output_names=outputs,
                dynamic_axes={name: {0: "batch"} for name in inputs + outputs},
                opset_version=OPSET,
                dynamo=False,
            )
        model = onnx.load(str(traced))  # a path: a big graph's weight files are read too
        # Weights beside the graph (policy.onnx.data): a protobuf holds 2 GB at most, and a
        # 500 M-parameter policy is ~2 GB in FP32. Every initializer, however small: a fine-tune
        # that moves only small tensors (LoRA adapters, heads) then leaves the graph file as it
        # was, and a delta deploy sends only those tensors.
        onnx.save_model(
            model,
            str(path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=f"{path.name}.data",
            size_threshold=0,
        )
        del model
    onnx.checker.check_model(str(path))  # a path: external data is read


@contextmanager
def quiet(*loggers: str) -> Iterator[None]:
    """Only errors from these loggers inside the block (``""``: the root logger)."""
    saved = {name: logging.getLogger(name).level for name in loggers}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.ERROR)
    try:
        yield
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
