"""The export bundle's layout: the one owner of its file names.

An export bundle is the directory ``robo-pipe export`` writes and every consumer reads (the
edge runtime, the evaluation of an exported policy, the latency gate, the model registry)::

    <bundle>/policy.onnx (+ policy.onnx.data)  the graph: normalisation inside, LoRA merged
    <bundle>/policy.<variant>.onnx (+ .data)    a precision variant of the same graph (e.g.
                                                ``policy.int8.onnx``: static INT8 with Q/DQ
                                                nodes), scored against the FP32 graph; the
                                                spec's ``variants`` lists them
    <bundle>/instruction_encoder.onnx (+ .data) the instruction's own graph, for a policy that
                                                encodes its instruction once per episode
                                                (``policy.type: pretrained``): tokens ->
                                                features the policy graph takes; FP32 always
    <bundle>/io_spec.json                       the I/O spec (:mod:`~.io_spec`): every tensor's
                                                name, dtype, shape and units; control rate,
                                                chunk, tokenizer; provenance and parity
    <bundle>/tokenizer/tokenizer.json           the instruction tokenizer (``tokenizers``)
    <bundle>/reference.npz                      reference inputs and torch outputs (parity
                                                checks on the target)
    <bundle>/normalization.json                 the statistics the graph normalises with
                                                (already inside it; for inspection)
    <bundle>/checksums.json                     size and sha256 of every file above
                                                (:mod:`robo_pipe.integrity`)

:func:`deploy_edge.bundle.files.verify_bundle` checks a bundle against its checksums; whatever
opens a bundle to use it (:class:`deploy_edge.exported.ExportedPolicy`, the registry, a release)
calls it first.

A copy may name its model differently (the registry's copy holds ``model.onnx``): the spec's
``onnx_file`` says which file is the model. Imports nothing beyond the standard library: an
edge device reads bundles without the training code.
"""

from __future__ import annotations

from pathlib import Path

ONNX_FILE = "policy.onnx"
"""The model as the export writes it (its external data, if any, is ``policy.onnx.data``)."""
INSTRUCTION_FILE = "instruction_encoder.onnx"
"""The instruction graph, when the policy has one
(:class:`~deploy_edge.bundle.io_spec.InstructionGraph`)."""
IO_SPEC_FILE = "io_spec.json"
TOKENIZER_DIR = "tokenizer"
"""Directory of the tokenizer files; ``tokenizer.json`` inside it is what the runtime loads."""
TOKENIZER_FILE = "tokenizer.json"
REFERENCE_FILE = "reference.npz"
NORMALIZATION_FILE = "normalization.json"


def bundle_root(directory: str | Path) -> Path:
    """The bundle directory ``directory`` names: itself, or the bundle holding it when it names
    its ``.onnx`` file."""
    root = Path(directory)
    return root.parent if root.suffix == ".onnx" else root


def relative_parts(name: str) -> tuple[str, ...]:
    """The components of the bundle-relative POSIX path ``name``; :class:`ValueError` saying
    what is wrong unless it is plain: not absolute, no empty, ``.`` or ``..`` component, no
    backslash or NUL."""
    if not name or name.startswith("/") or "\\" in name or "\x00" in name:
        raise ValueError("not a plain relative path")
    parts = tuple(name.split("/"))
    if any(part in ("", ".", "..") for part in parts):
        raise ValueError("has an empty, '.' or '..' component")
    return parts
