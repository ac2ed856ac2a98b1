"""An exported policy on an engine: what the robot's computer runs. No training code.

Reads an export directory (``stages/export``): ``io_spec.json``, the ONNX file, the tokenizer
files. Tokenizes instructions with the ``tokenizers`` library, feeds the engine, returns the
action chunk in robot units. Imports nothing from ``stages``: an edge device needs only numpy,
``tokenizers`` and its engine.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from deploy_edge.engines import InferenceEngine, make_engine
from robo_pipe.errors import RoboPipeError

IO_SPEC_FILE = "io_spec.json"
ONNX_FILE = "policy.onnx"


class IOSpecError(RoboPipeError, ValueError):
    """An export directory is incomplete, or its I/O spec disagrees with its model."""


def read_io_spec(export_dir: str | Path) -> dict[str, Any]:
    """``io_spec.json`` of an export, checked for the fields the runtime needs."""
    path = Path(export_dir) / IO_SPEC_FILE
    if not path.is_file():
        raise IOSpecError(f"{Path(export_dir)}: not an exported policy (no {IO_SPEC_FILE})")
    try:
        spec: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise IOSpecError(f"{path}: not valid JSON ({err})") from err
    required = ("inputs", "outputs", "cameras", "image_size", "chunk_len", "max_tokens", "pad_id")
    missing = [k for k in required if k not in spec]
    if missing:
        raise IOSpecError(f"{path}: missing fields {', '.join(missing)}")
    return spec


class ExportedPolicy:
    """Observations -> action chunk through an engine (see module docstring)."""

    def __init__(
        self,
        export_dir: str | Path,
        engine: str = "onnxruntime",
        precision: str = "fp32",
        threads: int = 1,
    ) -> None:
        from tokenizers import Tokenizer

        root = Path(export_dir)
        if root.suffix == ".onnx":
            root = root.parent
        self.spec = spec = read_io_spec(root)
        self.cameras = tuple(spec["cameras"])
        self.image_size = int(spec["image_size"])
        self.state_dim = int(spec["state_dim"])
        self.action_dim = int(spec["action_dim"])
        self.chunk_len = int(spec["chunk_len"])
        reference = _load_reference(root)
        # The model file: policy.onnx, or what the spec names (a registry copy uses model.onnx).
        onnx_file = root / str(spec.get("onnx_file", ONNX_FILE))
        self.engine: InferenceEngine = make_engine(onnx_file, engine, precision, threads, reference)
        declared = ([i["name"] for i in spec["inputs"]], [o["name"] for o in spec["outputs"]])
        actual = (self.engine.input_names, self.engine.output_names)
        if declared != actual:
            raise IOSpecError(
                f"{root / IO_SPEC_FILE}: declares inputs {declared[0]} and outputs {declared[1]}, "
                f"but the model has {actual[0]} and {actual[1]}"
            )
        tokenizer_file = root / str(spec.get("tokenizer", "tokenizer")) / "tokenizer.json"
        if not tokenizer_file.is_file():
            raise IOSpecError(f"{root}: tokenizer file {tokenizer_file.name} missing")
        self.tokenizer = Tokenizer.from_file(str(tokenizer_file))
        length = int(spec["max_tokens"])
        self.tokenizer.enable_padding(pad_id=int(spec["pad_id"]), length=length)
        self.tokenizer.enable_truncation(max_length=length)

    def feeds(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> dict[str, np.ndarray]:
        """Engine inputs for a batch: images uint8 ``(B, H, W, 3)``, state ``(B, state_dim)``."""
        encodings = self.tokenizer.encode_batch(instructions)
        feeds = {
            f"image_{c}": np.ascontiguousarray(images[c], dtype=np.uint8) for c in self.cameras
        }
        feeds["state"] = np.ascontiguousarray(state, dtype=np.float32)
        feeds["tokens"] = np.array([e.ids for e in encodings], dtype=np.int64)
        feeds["token_mask"] = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        return feeds

    def infer(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> np.ndarray:
        """Mean action chunk, float32 ``(B, chunk_len, action_dim)``, robot units."""
        out = self.engine.run(self.feeds(images, state, instructions))
        return np.asarray(out["actions"], dtype=np.float32)


def _load_reference(root: Path) -> dict[str, np.ndarray] | None:
    path = root / "reference.npz"
    if not path.is_file():
        return None
    with np.load(path, allow_pickle=False) as data:
        return {k: data[k] for k in data.files}
