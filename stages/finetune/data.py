"""Behaviour-cloning samples from LeRobot v3 datasets, held in memory.

Each sample is one frame: its camera images, state, instruction, the action chunk that follows
it (``chunk_len`` actions from this frame on, masked past the episode's end, as LeRobot's
``action_is_pad``) and, when the dataset records it, the named object's (x, y) for the
auxiliary loss. Several datasets (pretraining's task family) are concatenated; their
normalisation statistics are merged by frame counts.

Memory: a 64x64 camera costs 12 KiB per frame (17,490 frames: 215 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from stages.dataset.layout import ACTION_KEY, ENV_STATE_KEY, STATE_KEY, DatasetError
from stages.dataset.reader import open_dataset


@dataclass
class BCData:
    """Every frame of one or more datasets, ready to batch (N = frames)."""

    images: dict[str, np.ndarray]
    """Camera -> uint8 ``(N, H, W, 3)``."""
    state: np.ndarray
    """float32 ``(N, state_dim)``, robot units."""
    actions: np.ndarray
    """float32 ``(N, chunk_len, action_dim)``: the chunk starting at each frame."""
    action_valid: np.ndarray
    """bool ``(N, chunk_len)``: False where the chunk runs past its episode's end."""
    target_xy: np.ndarray | None
    """float32 ``(N, 2)``: the named object's centre (m), or None if not recorded."""
    task: np.ndarray
    """int64 ``(N,)``: index into ``instructions``."""
    instructions: list[str]
    stats: dict[str, Any]
    """Merged ``stats.json`` of the datasets (state, action, environment state)."""
    hashes: list[str]
    """Content hash of each dataset, in order."""

    def __len__(self) -> int:
        return len(self.state)

    def batch(self, idx: np.ndarray, rng: np.random.Generator, shift: int) -> dict[str, Any]:
        """Samples ``idx`` with images randomly translated by up to ``shift`` pixels (edges
        replicated), as numpy arrays keyed like the policy's inputs plus targets."""
        images = {c: _random_shift(v[idx], rng, shift) for c, v in self.images.items()}
        out: dict[str, Any] = {
            "images": images,
            "state": self.state[idx],
            "task": self.task[idx],
            "actions": self.actions[idx],
            "action_valid": self.action_valid[idx],
        }
        if self.target_xy is not None:
            out["target_xy"] = self.target_xy[idx]
        return out


def draw_delays(rng: np.random.Generator, n: int, max_ticks: int) -> np.ndarray:
    """``n`` inference delays (ticks, int64 ``(n,)``) for delay-conditioned training, BC's and
    RL's: none for half of them (a sync loop, and every episode's first chunk), else uniform
    over 1..``max_ticks``."""
    if max_ticks < 1:
        return np.zeros(n, np.int64)
    return np.where(rng.random(n) < 0.5, 0, rng.integers(1, max_ticks + 1, size=n))


def simulated_delays(
    batch: dict[str, Any], rng: np.random.Generator, max_ticks: int
) -> dict[str, np.ndarray]:
    """Delay-conditioned training (training-time real-time chunking): for each sample of
    ``batch`` a delay ``d`` drawn uniformly from 0..``max_ticks``; the first ``d`` actions of
    its chunk (where the episode has them) are the committed prefix, as the asynchronous
    runtime commits the plan it executes while the next chunk is computed. ``prefix``
    float32 ``(B, chunk_len, action_dim)`` robot units (zeros past the prefix) and
    ``prefix_mask`` float32 ``(B, chunk_len)``."""
    actions, valid = batch["actions"], batch["action_valid"]
    n, length, _ = actions.shape
    delays = draw_delays(rng, n, max_ticks)
    mask = (np.arange(length)[None, :] < delays[:, None]) & valid
    prefix = np.where(mask[..., None], actions, 0.0).astype(np.float32)
    return {"prefix": prefix, "prefix_mask": mask.astype(np.float32)}


def _random_shift(images: np.ndarray, rng: np.random.Generator, shift: int) -> np.ndarray:
    if shift == 0:
        return images
    n, h, w, _ = images.shape
    padded = np.pad(images, ((0, 0), (shift, shift), (shift, shift), (0, 0)), mode="edge")
    dy, dx = rng.integers(0, 2 * shift + 1, size=(2, n))
    return np.stack([padded[i, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(n)])


def chunk_targets(
    actions: np.ndarray, episode: np.ndarray, chunk_len: int, hold: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Action chunks ``(N, chunk_len, A)`` and their validity ``(N, chunk_len)`` from per-frame
    actions ``(N, A)`` in episode order; positions past an episode's end repeat its last action
    and are marked invalid. With ``hold`` (bool ``(A,)``: the components that are steps, the
    robot's ``delta`` ones), they are holding still instead, and valid: those components 0,
    the rest the last action (``finetune.bc.after_end: hold``)."""
    n = len(actions)
    offsets = np.arange(n)[:, None] + np.arange(chunk_len)[None, :]
    clipped = np.minimum(offsets, n - 1)
    valid = (offsets < n) & (episode[clipped] == episode[:, None])
    # Invalid positions point at the frame itself's episode end: walk back to the last valid one.
    last_valid = np.where(valid, offsets, -1).max(axis=1, keepdims=True)
    index = np.where(valid, clipped, last_valid)
    chunks = actions[index].astype(np.float32)
    if hold is None:
        return chunks, valid
    chunks[~valid] = np.where(hold, 0.0, chunks[~valid])
    return chunks, np.ones_like(valid)


def merge_stats(all_stats: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, Any]:
    """Mean/std of ``keys`` over several datasets' stats, weighted by frame counts."""
    merged: dict[str, Any] = {}
    for key in keys:
        parts = [s[key] for s in all_stats if key in s]
        if len(parts) < len(all_stats):
            continue
        counts = np.array([float(np.ravel(p["count"])[0]) for p in parts])
        means = np.array([p["mean"] for p in parts], dtype=np.float64)
        stds = np.array([p["std"] for p in parts], dtype=np.float64)
        weights = counts[:, None] / counts.sum()
        mean = (weights * means).sum(0)
        var = (weights * (stds**2 + means**2)).sum(0) - mean**2
        merged[key] = {
            "mean": mean.tolist(),
            "std": np.sqrt(np.maximum(var, 0.0)).tolist(),
            "count": [int(counts.sum())],
        }
    return merged


def load_bc_data(
    paths: list[str] | list[Path],
    cameras: tuple[str, ...],
    chunk_len: int,
    hold: np.ndarray | None = None,
) -> BCData:
    """Load and concatenate datasets (each validated by :func:`open_dataset`); ``hold``: the
    action components held still past an episode's end (:func:`chunk_targets`), None: masked.

    Raises:
        DatasetError: a dataset is invalid, lacks a camera the policy needs, or the datasets
            disagree on state/action sizes.
    """
    if not paths:
        raise DatasetError("no datasets to train on")
    images: dict[str, list[np.ndarray]] = {c: [] for c in cameras}
    state, actions, valid, target, task = [], [], [], [], []
    instructions: list[str] = []
    all_stats, hashes = [], []
    for path in paths:
        dataset = open_dataset(path)
        missing = [c for c in cameras if c not in dataset.cameras]
        if missing:
            raise DatasetError(
                f"{path}: no camera {missing[0]!r} (it has {', '.join(dataset.cameras)}); the "
                "policy's cameras come from scene.cameras"
            )
        frames = dataset.frames()
        a, v = chunk_targets(frames[ACTION_KEY], frames["episode_index"], chunk_len, hold)
        actions.append(a)
        valid.append(v)
        state.append(frames[STATE_KEY].astype(np.float32))
        # The auxiliary target: a task family's first two env-state components (TaskFamily).
        target.append(frames[ENV_STATE_KEY][:, :2] if ENV_STATE_KEY in frames else None)
        # Task ids are per dataset; map them into one list of instructions.
        offset = {i: _index(instructions, text) for i, text in enumerate(dataset.tasks)}
        task.append(np.array([offset[int(t)] for t in frames["task_index"]], dtype=np.int64))
        for cam in cameras:
            images[cam].append(dataset.camera_frames(cam))
        all_stats.append(dataset.stats)
        hashes.append(dataset.content_hash())
    if len({s.shape[1] for s in state}) > 1 or len({a.shape[2] for a in actions}) > 1:
        listed = ", ".join(map(str, paths))
        raise DatasetError(f"datasets disagree on state or action size: {listed}")
    has_target = all(t is not None for t in target)
    return BCData(
        images={c: np.concatenate(v) for c, v in images.items()},
        state=np.concatenate(state),
        actions=np.concatenate(actions),
        action_valid=np.concatenate(valid),
        target_xy=np.concatenate(target).astype(np.float32) if has_target else None,  # type: ignore[arg-type]
        task=np.concatenate(task),
        instructions=instructions,
        stats=merge_stats(all_stats, (STATE_KEY, ACTION_KEY, ENV_STATE_KEY)),
        hashes=hashes,
    )


def _index(items: list[str], item: str) -> int:
    if item not in items:
        items.append(item)
    return items.index(item)
