"""Shards: the blocks of consecutive episode seeds collection writes, each atomic.

A shard is written into a temporary directory under ``<root>/.staging`` (named after its
writer's pid and host), fsynced and committed by renaming that directory (atomic on POSIX), with
``shard.json`` -- its manifest, holding the sha256 of every file -- written last. A shard is
therefore either wholly there or not at all: killing collection at any moment loses at most the
shards in flight, and a re-run redoes exactly those. Clean-up removes only the temporaries of
dead writers. :mod:`stages.dataset.writer` finalizes the committed shards into a dataset.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from robo_pipe.atomic import discard_dead_temporaries, fsync_dir, fsync_tree, temporary_path
from robo_pipe.integrity import file_sha256, writing
from stages.dataset.layout import (
    ACTION_KEY,
    ENV_STATE_KEY,
    STAGING_DIR,
    STATE_KEY,
    DatasetError,
    extra_key,
)
from stages.dataset.video import encode_video

SHARD_MANIFEST = "shard.json"
FRAMES_FILE = "frames.parquet"
SHARD_KEPT = "the shards committed before it are kept"
"""What a full disk while writing a shard leaves (:class:`~robo_pipe.errors.OutOfSpaceError`)."""


@dataclass
class EpisodeBuffer:
    """One recorded episode, before it is written.

    ``images``: camera -> uint8 (T, H, W, 3); ``state``/``action``: float32 (T, d);
    ``reward``/``done``/``success``: (T,) -- the outcome of taking ``action[t]`` at frame t;
    ``env_state``: float32 (T, k) simulator ground truth at frame t (LeRobot's
    ``observation.environment_state``; for training signals such as auxiliary losses, never a
    policy input), or None for sources that have none (a real robot).
    """

    seed: int
    instruction: str
    images: dict[str, np.ndarray]
    state: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    success: np.ndarray
    env_state: np.ndarray | None = None
    extras: dict[str, np.ndarray] = field(default_factory=dict)
    """More float32 ``(T, k)`` features, each written as ``observation.<name>`` (a real
    robot's IMU readings, imported from a bag); {} for the simulator's sources."""

    @property
    def length(self) -> int:
        """Frames (= control steps) in the episode."""
        return len(self.action)

    @property
    def solved(self) -> bool:
        """Whether the episode ended in success."""
        return bool(self.success[-1]) if len(self.success) else False


@dataclass
class ShardManifest:
    """What a committed shard holds (``shard.json``)."""

    start: int
    """Index of its first seed in the collection's seed list."""
    end: int
    """One past its last seed index."""
    episodes: list[dict[str, Any]]
    """Per attempted episode: seed, instruction, length, success, kept."""
    image_histograms: dict[str, list[list[int]]]
    """camera -> per channel 256-bin histogram of pixel values over the kept frames."""
    files: dict[str, str]
    """File name -> sha256."""
    timings: dict[str, float] = field(default_factory=dict)
    """Seconds spent per phase (simulate, render, source, encode, write)."""
    node: str = ""
    """The Ray node that collected it (``""``: the collecting process was not a Ray worker)."""

    @property
    def kept(self) -> list[dict[str, Any]]:
        """The episodes written to the shard."""
        return [e for e in self.episodes if e["kept"]]


def shard_name(start: int, end: int) -> str:
    """Directory name of the shard covering seed indices [start, end)."""
    return f"shard-{start:08d}-{end:08d}"


def write_shard(
    staging: Path,
    start: int,
    end: int,
    episodes: Sequence[EpisodeBuffer],
    keep_failed: bool,
    fps: float,
    crf: int,
    timings: dict[str, float] | None = None,
    node: str = "",
) -> ShardManifest:
    """Write and atomically commit one shard; return its manifest."""
    final = staging / shard_name(start, end)
    tmp = temporary_path(final)
    kept = [ep for ep in episodes if keep_failed or ep.solved]
    timings = dict(timings or {})
    cameras = sorted(episodes[0].images) if episodes else []
    histograms: dict[str, list[list[int]]] = {}

    with writing(final, tmp, kept=SHARD_KEPT):  # a full disk: no half shard stays
        tmp.mkdir(parents=True)
        t0 = time.perf_counter()
        for cam in cameras if kept else []:
            frames = np.concatenate([ep.images[cam] for ep in kept])
            encode_video(frames, tmp / f"{cam}.mp4", fps, crf)
            histograms[cam] = [
                np.bincount(frames[..., c].ravel(), minlength=256).tolist() for c in range(3)
            ]
        timings["encode"] = timings.get("encode", 0.0) + time.perf_counter() - t0

        t0 = time.perf_counter()
        if kept:
            table = pa.table(
                {
                    "episode": pa.array(
                        np.repeat(np.arange(len(kept)), [ep.length for ep in kept])
                    ),
                    "frame_index": pa.array(np.concatenate([np.arange(ep.length) for ep in kept])),
                    STATE_KEY: fixed_list(np.concatenate([ep.state for ep in kept])),
                    ACTION_KEY: fixed_list(np.concatenate([ep.action for ep in kept])),
                    "next.reward": pa.array(
                        np.concatenate([ep.reward for ep in kept]).astype(np.float32)
                    ),
                    "next.done": pa.array(np.concatenate([ep.done for ep in kept]).astype(bool)),
                    "next.success": pa.array(
                        np.concatenate([ep.success for ep in kept]).astype(bool)
                    ),
                }
            )
            if kept[0].env_state is not None:
                env_state = np.concatenate(
                    [ep.env_state for ep in kept if ep.env_state is not None]
                )
                table = table.append_column(ENV_STATE_KEY, fixed_list(env_state))
            for name in sorted(kept[0].extras):
                values = np.concatenate([ep.extras[name] for ep in kept])
                table = table.append_column(extra_key(name), fixed_list(values))
            pq.write_table(table, tmp / FRAMES_FILE)
        manifest = ShardManifest(
            start=start,
            end=end,
            episodes=[
                {
                    "seed": ep.seed,
                    "instruction": ep.instruction,
                    "length": ep.length,
                    "success": ep.solved,
                    "kept": keep_failed or ep.solved,
                }
                for ep in episodes
            ],
            image_histograms=histograms,
            files={p.name: file_sha256(p) for p in sorted(tmp.iterdir())},
            timings=timings,
            node=node,
        )
        timings["write"] = timings.get("write", 0.0) + time.perf_counter() - t0  # manifest's dict
        manifest_text = json.dumps(asdict(manifest), indent=1)
        write_text(tmp / SHARD_MANIFEST, manifest_text, SHARD_KEPT)
    fsync_tree(tmp)  # durable before it is committed: no renamed shard with empty files
    try:
        os.rename(tmp, final)  # the commit
    except OSError:  # another worker committed the same shard first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        fsync_dir(staging)
    return manifest


def fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
    values = np.ascontiguousarray(values, dtype=np.float32)
    return pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), values.shape[1])


def table_to_numpy(table: pa.Table) -> dict[str, np.ndarray]:
    """Every column as an array: fixed-size lists become ``(rows, width)``, scalars ``(rows,)``."""
    out: dict[str, np.ndarray] = {}
    for name in table.column_names:
        column = table.column(name).combine_chunks()
        if pa.types.is_fixed_size_list(column.type):
            out[name] = column.flatten().to_numpy().reshape(-1, column.type.list_size)
        else:
            out[name] = column.to_numpy(zero_copy_only=False)
    return out


def write_text(path: Path, text: str, kept: str) -> None:
    """Write ``path`` whole or not at all (a full disk is named with this file; ``kept`` says
    what such a failure leaves)."""
    tmp = temporary_path(path)
    with writing(path, tmp, kept=kept):
        tmp.write_text(text)
        os.replace(tmp, path)


def write_parquet(path: Path, table: pa.Table, kept: str) -> None:
    """Write ``path`` whole or not at all (a full disk is named with this file; ``kept`` says
    what such a failure leaves)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    with writing(path, tmp, kept=kept):
        pq.write_table(table, tmp)
        os.replace(tmp, path)


def read_shard(path: Path) -> ShardManifest:
    """Load a committed shard's manifest and check its files against their hashes."""
    manifest_path = path / SHARD_MANIFEST
    try:
        raw = json.loads(manifest_path.read_text())
        manifest = ShardManifest(**raw)
    except (OSError, ValueError, TypeError) as err:
        raise DatasetError(f"{manifest_path}: unreadable shard manifest: {err}") from err
    for name, digest in manifest.files.items():
        file = path / name
        if not file.is_file():
            raise DatasetError(f"{file}: missing from committed shard")
        if file_sha256(file) != digest:
            raise DatasetError(f"{file}: corrupt (sha256 differs from the shard manifest)")
    return manifest


def committed_shards(root: Path) -> dict[tuple[int, int], Path]:
    """Committed shard directories under ``root/.staging`` keyed by (start, end)."""
    staging = root / STAGING_DIR
    shards = {}
    if staging.is_dir():
        for path in staging.iterdir():
            parts = path.name.split("-")
            if len(parts) == 3 and parts[0] == "shard" and (path / SHARD_MANIFEST).is_file():
                shards[(int(parts[1]), int(parts[2]))] = path
    return shards


def discard_uncommitted(root: Path) -> int:
    """Delete the half-written shards and datasets that killed runs left (in ``.staging`` and
    beside ``root``); return how many. Only a dead writer's: a temporary whose name says its
    pid is alive (or is another host's) is left alone, whoever calls this."""
    dead = discard_dead_temporaries(root / STAGING_DIR)
    return len(dead) + len(discard_dead_temporaries(root.parent, of=root.name))
