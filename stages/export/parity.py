"""Parity of an exported graph with the torch policy it came from: the inputs it is measured
on (random images and states with the task's instructions, and real dataset frames) and the
measurement, a few frames at a time, through the chain the edge runtime runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robo_pipe.errors import RoboPipeError
from robots.limits import non_finite
from stages.policy.base import VLAPolicy
from stages.policy.onnx_graph import OnnxInstructionEncoder, OnnxPolicy

PARITY_BATCH = 4
"""Frames per parity run."""
PARITY_TOLERANCE = 1e-4
"""Largest accepted |ONNX Runtime - torch| (robot units; actions are ~0.01-0.08 rad)."""


class ExportError(RoboPipeError, RuntimeError):
    """The exported graph does not reproduce the policy within the parity tolerance, or emits
    a non-finite value for the finite parity inputs."""


def example_instructions(policy: VLAPolicy, n: int = 2) -> list[str]:
    """``n`` instructions of the policy's task family (``cfg.task``), two distinct ones
    repeated: what the graphs are traced and their parity measured with."""
    from sim_scenes.tasks import task_family

    corpus = task_family(policy.cfg.task).instructions()
    pair = [corpus[0], corpus[len(corpus) // 2]]
    return [pair[i % 2] for i in range(n)]


def random_inputs(policy: VLAPolicy, seed: int, n: int = 8) -> dict[str, np.ndarray]:
    """Random images, states around the training mean, real instructions of the policy's task
    family (:func:`example_instructions`)."""
    rng = np.random.default_rng(seed)
    cfg = policy.cfg
    inputs: dict[str, np.ndarray] = {
        f"image_{c}": rng.integers(0, 256, (n, cfg.image_size, cfg.image_size, 3), np.uint8)
        for c in cfg.cameras
    }
    noise = rng.normal(size=(n, cfg.state_dim)) * policy.state_std.numpy()
    inputs["state"] = (policy.state_mean.numpy() + noise).astype(np.float32)
    inputs["tokens"], inputs["token_mask"] = policy.tokenizer(example_instructions(policy, n))
    return inputs | random_prefix(policy, rng, n)


def random_prefix(policy: VLAPolicy, rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """A delay-conditioned policy's prefix inputs for ``n`` frames: actions around the training
    mean, the first 0..``prefix_ticks`` of each committed (empty for another policy)."""
    cfg = policy.cfg
    if policy.prefix_encoder is None:
        return {}
    shape = (n, cfg.chunk_len, cfg.action_dim)
    actions = policy.action_mean.numpy() + rng.normal(size=shape) * policy.action_std.numpy()
    committed = rng.integers(0, cfg.prefix_ticks + 1, size=n)
    mask = (np.arange(cfg.chunk_len)[None, :] < committed[:, None]).astype(np.float32)
    return {"prefix": (actions * mask[..., None]).astype(np.float32), "prefix_mask": mask}


def dataset_inputs(policy: VLAPolicy, root: Path, n: int = 32) -> dict[str, np.ndarray]:
    """``n`` frames spread over a LeRobot dataset: its images, states and instructions."""
    from stages.dataset.layout import STATE_KEY
    from stages.dataset.reader import open_dataset

    dataset = open_dataset(root)
    frames = dataset.frames()
    idx = np.linspace(0, dataset.num_frames - 1, n).astype(int)
    inputs = {f"image_{c}": dataset.camera_frames(c)[idx] for c in policy.cfg.cameras}
    inputs["state"] = frames[STATE_KEY][idx].astype(np.float32)
    texts = [dataset.tasks[int(t)] for t in frames["task_index"][idx]]
    inputs["tokens"], inputs["token_mask"] = policy.tokenizer(texts)
    return inputs | random_prefix(policy, np.random.default_rng(n), n)


@dataclass(frozen=True)
class TorchReference:
    """What the torch policy gives on some inputs, computed before any ONNX Runtime session
    exists: the export frees the torch model before it loads a graph (at 1 B parameters both
    at once do not fit in 24 GiB)."""

    inputs: dict[str, np.ndarray]
    """The observations: images, ``state``, ``tokens``, ``token_mask`` (and any prefix)."""
    graph_inputs: dict[str, np.ndarray]
    """The policy graph's inputs from them (with an instruction graph: the torch features of
    the tokens as ``instruction``)."""
    outputs: dict[str, np.ndarray]
    """The torch policy's outputs, by :attr:`OnnxPolicy.output_names`."""


def torch_reference(wrapper: OnnxPolicy, inputs: dict[str, np.ndarray]) -> TorchReference:
    """The torch policy (``wrapper``, as exported) on ``inputs``, a few frames at a time (a
    512 px vision tower's activations for 32 frames at once are GiBs)."""
    frames = len(inputs["state"])
    outputs: list[dict[str, np.ndarray]] = []
    graphs: list[dict[str, np.ndarray]] = []
    for i in range(0, frames, PARITY_BATCH):
        chunk = {k: v[i : i + PARITY_BATCH] for k, v in inputs.items()}
        graph = wrapper.graph_inputs(chunk)
        with torch.no_grad():
            expected = wrapper(*(torch.as_tensor(graph[k]) for k in wrapper.input_names))
        outputs.append({k: v.numpy() for k, v in zip(wrapper.output_names, expected, strict=True)})
        graphs.append(graph)
    return TorchReference(
        inputs=dict(inputs),
        graph_inputs={k: np.concatenate([g[k] for g in graphs]) for k in graphs[0]},
        outputs={k: np.concatenate([o[k] for o in outputs]) for k in wrapper.output_names},
    )


def measure_parity(reference: TorchReference, session: Any, encoder: Any) -> tuple[float, float]:
    """The largest ONNX Runtime deviation from the torch outputs of ``reference``, and the
    instruction graph's largest deviation from torch's features (0 without one). With an
    instruction graph (``encoder``) ONNX Runtime runs the chain the runtime runs: tokens ->
    ``encoder`` -> features -> ``session``.

    :class:`ExportError` if an ONNX output holds NaN or inf (:func:`robots.limits.non_finite`):
    the inputs are finite, so the graph can emit such a value on the robot; and the deviation
    cannot show it (NaN on both sides compares as no deviation at all)."""
    names = [i.name for i in session.get_inputs()]
    outputs = list(reference.outputs)
    frames = len(reference.inputs["state"])
    error = text_error = 0.0
    for i in range(0, frames, PARITY_BATCH):
        chunk = {k: v[i : i + PARITY_BATCH] for k, v in reference.inputs.items()}
        feeds = dict(chunk) | {
            k: v[i : i + PARITY_BATCH] for k, v in reference.graph_inputs.items() if k not in chunk
        }
        if encoder is not None:
            text = {k: chunk[k] for k in OnnxInstructionEncoder.input_names}
            feeds["instruction"] = encoder.run(OnnxInstructionEncoder.output_names, text)[0]
            torch_features = reference.graph_inputs["instruction"][i : i + PARITY_BATCH]
            text_error = max(text_error, float(np.abs(feeds["instruction"] - torch_features).max()))
        got = session.run(outputs, {k: feeds[k] for k in names})
        for name, values in zip(outputs, got, strict=True):
            if refused := non_finite(name, values):
                raise ExportError(
                    f"the ONNX graph emits a non-finite value for finite inputs (frame {i} on): "
                    f"{refused}"
                )
        want = [reference.outputs[k][i : i + PARITY_BATCH] for k in outputs]
        error = max(error, *(float(np.abs(g - w).max()) for g, w in zip(got, want, strict=True)))
    return error, text_error
