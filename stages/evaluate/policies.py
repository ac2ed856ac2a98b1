"""The policies evaluation can run: a checkpoint (torch) or an exported model (ONNX Runtime).

Both present the same small interface, :class:`ActingPolicy`, so an evaluation does not care
which one it plays, and a checkpoint and its export can be compared episode by episode.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

import numpy as np

from sim_scenes.batched_env import BatchedObservation


class PolicySpecError(ValueError):
    """A policy cannot be loaded, or does not fit the robot or scene it is asked to act in."""


class ActingPolicy(Protocol):
    """What evaluation needs from a policy (shapes in robot units)."""

    cameras: tuple[str, ...]
    image_size: int
    state_dim: int
    action_dim: int
    chunk_len: int

    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        """Mean action chunk, float32 ``(N, chunk_len, action_dim)``."""
        ...


class CheckpointPolicy:
    """A training checkpoint run with torch (inference mode, ``threads`` CPU threads)."""

    def __init__(self, path: str | Path, threads: int = 1) -> None:
        import torch

        from stages.policy.checkpoint import CheckpointError, load_policy

        torch.set_num_threads(threads)
        try:
            self.policy = load_policy(path).eval()
        except CheckpointError as err:
            raise PolicySpecError(str(err)) from err
        cfg = self.policy.cfg
        self.cameras = tuple(cfg.cameras)
        self.image_size = cfg.image_size
        self.state_dim = cfg.state_dim
        self.action_dim = cfg.action_dim
        self.chunk_len = cfg.chunk_len

    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        return self.policy.predict_chunk(obs)


class OnnxRuntimePolicy:
    """An exported policy (``stages/export``) run with the ONNX Runtime engine on the CPU."""

    def __init__(self, export_dir: str | Path, threads: int = 1) -> None:
        from deploy_edge.engines import EngineError, OnnxRuntimeEngine
        from stages.export.onnx import IO_SPEC_FILE, ONNX_FILE

        root = Path(export_dir)
        if root.suffix == ".onnx":
            root = root.parent
        spec_path = root / IO_SPEC_FILE
        if not spec_path.is_file():
            raise PolicySpecError(f"{root}: not an exported policy (no {IO_SPEC_FILE})")
        spec = json.loads(spec_path.read_text())
        self.cameras = tuple(spec["cameras"])
        self.image_size = int(spec["image_size"])
        self.state_dim = int(spec["state_dim"])
        self.action_dim = int(spec["action_dim"])
        self.chunk_len = int(spec["chunk_len"])
        tokenizer_dir = root / spec["tokenizer"]
        if spec["policy_type"] == "default":
            from stages.policy.tokenizer import InstructionTokenizer

            self.tokenizer = InstructionTokenizer.load(tokenizer_dir, int(spec["max_tokens"]))
        else:
            from stages.policy.hub_vla import HubTokenizer

            self.tokenizer = HubTokenizer.load(tokenizer_dir, int(spec["max_tokens"]))  # type: ignore[assignment]
        try:
            self.engine = OnnxRuntimeEngine(root / ONNX_FILE, threads=threads)
        except EngineError as err:
            raise PolicySpecError(str(err)) from err

    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        tokens, mask = self.tokenizer(list(obs.instruction))
        feeds = {f"image_{c}": obs.images[c] for c in self.cameras}
        feeds["state"] = np.asarray(obs.state, dtype=np.float32)
        feeds["tokens"], feeds["token_mask"] = tokens, mask
        return np.asarray(self.engine.run(feeds)["actions"], dtype=np.float32)


def load_acting_policy(path: str | Path, threads: int = 1) -> ActingPolicy:
    """A checkpoint directory (``policy.json``) or an export (directory or ``.onnx`` file)."""
    p = Path(path)
    if not p.exists():
        raise PolicySpecError(f"{p}: no such checkpoint or exported policy")
    if (p / "policy.json").is_file():
        return CheckpointPolicy(p, threads)
    return OnnxRuntimePolicy(p, threads)
