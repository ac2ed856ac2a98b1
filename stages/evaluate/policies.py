"""The policies evaluation can run: a checkpoint (torch) or an exported model (ONNX Runtime).

Both present the same small interface, :class:`ActingPolicy`, so an evaluation does not care
which one it plays, and a checkpoint and its export can be compared episode by episode. An
export's precision variant is played by naming its file (``<export>/policy.int8.onnx``) or by
``OnnxRuntimePolicy(export, variant="int8")``: the FP32 export and its INT8 variant compare
the same way.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from robo_pipe.errors import RoboPipeError
from sim_scenes.batched_env import BatchedObservation


class PolicySpecError(RoboPipeError, ValueError):
    """A policy cannot be loaded, or does not fit the robot or scene it is asked to act in."""


class ActingPolicy(Protocol):
    """What evaluation needs from a policy (shapes in robot units)."""

    robot: str
    """The robot it was made for (registry name)."""
    cameras: tuple[str, ...]
    image_size: int
    state_dim: int
    action_dim: int
    chunk_len: int

    def predict_chunk(self, obs: BatchedObservation) -> np.ndarray:
        """Mean action chunk, float32 ``(N, chunk_len, action_dim)``. A delay-conditioned
        policy (``prefix_ticks`` > 0) also takes keywords ``prefix`` and ``prefix_mask``, the
        committed prefix (:func:`deploy_edge.async_loop.committed_prefix`)."""
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
        self.robot = cfg.robot
        self.cameras = tuple(cfg.cameras)
        self.image_size = cfg.image_size
        self.state_dim = cfg.state_dim
        self.action_dim = cfg.action_dim
        self.chunk_len = cfg.chunk_len
        self.prefix_ticks = cfg.prefix_ticks

    def predict_chunk(
        self,
        obs: BatchedObservation,
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        return self.policy.predict_chunk(obs, prefix, prefix_mask)


class OnnxRuntimePolicy:
    """An exported policy (``stages/export``) on the edge runtime's ONNX Runtime engine: its
    FP32 graph, or with ``variant`` that precision variant of it (``int8``)."""

    def __init__(
        self, export_dir: str | Path, threads: int = 1, variant: str | None = None
    ) -> None:
        from deploy_edge.engines import EngineError
        from deploy_edge.exported import ExportedPolicy, IOSpecError

        self.variant = variant
        try:
            if variant is None:
                self.exported = ExportedPolicy(export_dir, threads=threads)
            else:
                self.exported = ExportedPolicy(export_dir, threads=threads, variant=variant)
        except (EngineError, IOSpecError) as err:
            raise PolicySpecError(str(err)) from err
        self.robot = self.exported.robot
        self.cameras = self.exported.cameras
        self.image_size = self.exported.image_size
        self.state_dim = self.exported.state_dim
        self.action_dim = self.exported.action_dim
        self.chunk_len = self.exported.chunk_len
        self.prefix_ticks = self.exported.prefix_ticks

    def predict_chunk(
        self,
        obs: BatchedObservation,
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        return self.exported.infer(
            obs.images, obs.state, list(obs.instruction), prefix, prefix_mask
        )


def load_acting_policy(path: str | Path, threads: int = 1) -> ActingPolicy:
    """A checkpoint directory (``policy.json``) or an export (directory or ``.onnx`` file; the
    file of one of its precision variants, ``policy.int8.onnx``, plays that variant)."""
    p = Path(path)
    if not p.exists():
        raise PolicySpecError(f"{p}: no such checkpoint or exported policy")
    if (p / "policy.json").is_file():
        return CheckpointPolicy(p, threads)
    variant = variant_of(p)
    return OnnxRuntimePolicy(p.parent if variant else p, threads, variant)


def variant_of(path: str | Path) -> str | None:
    """The name of the precision variant whose model file ``path`` is, in its bundle's spec;
    None for anything else (the FP32 model, a directory, a file of no bundle)."""
    from deploy_edge.bundle.io_spec import IOSpecError, read_io_spec

    p = Path(path)
    if p.suffix != ".onnx":
        return None
    try:
        spec = read_io_spec(p.parent)
    except IOSpecError:
        return None
    return next((v.name for v in spec.variants if v.onnx_file == p.name), None)
