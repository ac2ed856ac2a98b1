"""The LeRobotDataset v3.0 layout robo-pipe writes and reads, and the ``DatasetRef`` record.

    <root>/meta/info.json                              schema, fps, totals, path templates
    <root>/meta/stats.json                             per-feature mean/std/min/max/count/quantiles
    <root>/meta/tasks.parquet                          instruction text -> task_index
    <root>/meta/episodes/chunk-XXX/file-XXX.parquet    per episode: length, task, row/video spans
    <root>/data/chunk-XXX/file-XXX.parquet             per frame: state, action, indices, timestamp
    <root>/videos/<camera key>/chunk-XXX/file-XXX.mp4  camera frames, episodes back to back
    <root>/meta/robo_pipe.json                         provenance (config, seeds, code version)
    <root>/meta/checksums.json                         size and sha256 of every file above
    <root>/.staging/                                   robo-pipe's committed shards (not part of v3)

This matches what LeRobot 0.6's ``LeRobotDataset.create(...).finalize()`` writes (checked file
by file), so ``LeRobotDataset(repo_id, root=<root>)`` loads it; robo-pipe's own two files sit
under ``meta/``, where LeRobot ignores them. ``meta/checksums.json``
(:mod:`robo_pipe.integrity`) is written just before ``meta/info.json``, the commit marker, and
:func:`verify_dataset` checks every file against it when the dataset is opened.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robo_pipe.errors import RoboPipeError
from robo_pipe.integrity import FileSum, file_sha256, tree_sha256, verify_checksums
from robo_pipe.records import Record


class DatasetError(RoboPipeError, ValueError):
    """A dataset or shard is missing, corrupt or inconsistent; the message names the file."""


CODEBASE_VERSION = "v3.0"
CHUNKS_SIZE = 1000
"""Files per chunk directory (LeRobot's default)."""
INFO_PATH = "meta/info.json"
STATS_PATH = "meta/stats.json"
TASKS_PATH = "meta/tasks.parquet"
PROVENANCE_PATH = "meta/robo_pipe.json"
CHECKSUMS_PATH = "meta/checksums.json"
STAGING_DIR = ".staging"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"

STATE_KEY = "observation.state"
ACTION_KEY = "action"
ENV_STATE_KEY = "observation.environment_state"
"""Simulator ground truth per frame (LeRobot's name for it), e.g. the named object's position."""
IMAGE_PREFIX = "observation.images."
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)


def extra_key(name: str) -> str:
    """Feature key of an extra float feature, e.g. ``observation.imu`` (see
    :attr:`~stages.dataset.writer.DatasetSchema.extras`)."""
    return f"observation.{name}"


def camera_key(camera: str) -> str:
    """Feature key of a camera stream, e.g. ``observation.images.scene``."""
    return IMAGE_PREFIX + camera


def chunk_file(file_number: int) -> dict[str, int]:
    """Chunk and file index of the ``file_number``-th file of a kind."""
    return {"chunk_index": file_number // CHUNKS_SIZE, "file_index": file_number % CHUNKS_SIZE}


@dataclass(frozen=True)
class DatasetRef(Record):
    """A committed dataset: what the collect stage hands to training (JSON-serialisable)."""

    path: str
    content_hash: str
    """sha256 over every v3 file (paths and bytes); provenance and staging excluded."""
    episodes: int
    frames: int
    fps: float
    robot: str
    variant: str
    features: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Feature key -> {dtype, shape} (as in meta/info.json)."""
    source: str = ""
    """Demonstration source that produced the episodes."""
    source_success_rate: float = 0.0
    """Share of attempted episodes the source solved (failed ones may have been dropped)."""


def v3_files(root: Path) -> list[Path]:
    """The files that make up the v3 dataset proper, sorted (no provenance, no checksums, no
    staging)."""
    own = {PROVENANCE_PATH, CHECKSUMS_PATH}
    files = []
    for top in ("meta", "data", "videos"):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and path.relative_to(root).as_posix() not in own:
                files.append(path)
    return files


def dataset_files(root: Path) -> list[Path]:
    """The files ``meta/checksums.json`` covers: :func:`v3_files` and the provenance."""
    provenance = root / PROVENANCE_PATH
    return v3_files(root) + ([provenance] if provenance.is_file() else [])


def content_hash(root: Path, sums: Mapping[str, FileSum] | None = None) -> str:
    """sha256 over the relative paths and bytes of :func:`v3_files`; from ``sums`` (verified
    entries, see :func:`verify_dataset`) when given, instead of reading the files again."""
    pairs = []
    for path in v3_files(root):
        rel = path.relative_to(root).as_posix()
        pairs.append((rel, sums[rel].sha256 if sums is not None else file_sha256(path)))
    return tree_sha256(pairs)


VERIFY_FIX = (
    "remove its meta/info.json and re-run robo-pipe collect with the same config and --out: it "
    "finalizes the dataset again from its committed shards"
)
"""What to do about a dataset that fails verification (or predates checksums)."""


def verify_dataset(root: Path) -> dict[str, FileSum]:
    """Check every file of the dataset at ``root`` against ``meta/checksums.json`` (sizes, then
    sha256, each file read once); return the verified entries. Raises
    :class:`~robo_pipe.integrity.IntegrityError` naming the file and the check."""
    return verify_checksums(root, dataset_files(root), CHECKSUMS_PATH, VERIFY_FIX)
