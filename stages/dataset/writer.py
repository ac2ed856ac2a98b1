"""Writing LeRobot v3 datasets: a deterministic finalize of the committed shards.

Collection writes atomic shards (:mod:`stages.dataset.shards`). :func:`finalize` builds the v3
layout from the committed shards, in seed order, each shard becoming one data file, one video
file per camera and one episodes file. It is a pure function of the shards, so an
interrupted-and-resumed collection ends byte-identical to an uninterrupted one. The new dataset
is built whole beside ``root`` (``meta/checksums.json``, the size and sha256 of every file, then
``meta/info.json`` last), with ``.staging`` mirrored into it by hard links, then fsynced and
swapped in (:func:`~robo_pipe.atomic.replace_dir`): a re-finalize (more episodes appended)
killed at any moment leaves the previous complete dataset loadable, and the committed shards are
kept either way.

A full disk (or file size limit) while writing a shard or finalizing raises
:class:`~robo_pipe.errors.OutOfSpaceError`: the half-written shard or dataset is removed, the
committed shards and the previous dataset stay, and a re-run resumes from them.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from robo_pipe.atomic import (
    discard_dead_temporaries,
    replace_dir,
    temporary_path,
)
from robo_pipe.integrity import FileSum, file_sha256, file_sums, write_checksums, writing
from stages.dataset.layout import (
    ACTION_KEY,
    CHECKSUMS_PATH,
    CHUNKS_SIZE,
    CODEBASE_VERSION,
    DATA_PATH,
    ENV_STATE_KEY,
    EPISODES_PATH,
    INFO_PATH,
    PROVENANCE_PATH,
    QUANTILES,
    STAGING_DIR,
    STATE_KEY,
    STATS_PATH,
    TASKS_PATH,
    VIDEO_PATH,
    DatasetError,
    camera_key,
    chunk_file,
    dataset_files,
    extra_key,
)
from stages.dataset.shards import (
    FRAMES_FILE,
    ShardManifest,
    read_shard,
    table_to_numpy,
    write_parquet,
    write_text,
)
from stages.dataset.video import CODEC, GOP, PIX_FMT

FINALIZE_KEPT = (
    "the committed shards and the previous dataset (if any) are kept; a re-run finalizes from them"
)
"""What a full disk while finalizing leaves."""


@dataclass(frozen=True)
class DatasetSchema:
    """What every frame holds: robot, rate, state/action names, cameras and image size."""

    robot: str
    fps: float
    state_names: tuple[str, ...]
    action_names: tuple[str, ...]
    cameras: tuple[str, ...]
    image_size: int
    crf: int
    env_state_names: tuple[str, ...] = ()
    """Names of the ``observation.environment_state`` values; empty when not recorded."""
    extras: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """More float features, ``observation.<name>`` -> their values' names (an imported bag's
    IMU); never a policy input."""

    def features(self) -> dict[str, dict[str, Any]]:
        """The ``features`` block of ``meta/info.json``."""
        features: dict[str, dict[str, Any]] = {}
        for cam in self.cameras:
            features[camera_key(cam)] = {
                "dtype": "video",
                "shape": [self.image_size, self.image_size, 3],
                "names": ["height", "width", "channels"],
                "info": {
                    "video.height": self.image_size,
                    "video.width": self.image_size,
                    "video.codec": CODEC,
                    "video.pix_fmt": PIX_FMT,
                    "video.fps": self.fps,
                    "video.channels": 3,
                    "has_audio": False,
                    "video.g": GOP,
                    "video.crf": self.crf,
                    "is_depth_map": False,
                },
            }
        features[STATE_KEY] = {
            "dtype": "float32",
            "shape": [len(self.state_names)],
            "names": list(self.state_names),
        }
        features[ACTION_KEY] = {
            "dtype": "float32",
            "shape": [len(self.action_names)],
            "names": list(self.action_names),
        }
        if self.env_state_names:
            features[ENV_STATE_KEY] = {
                "dtype": "float32",
                "shape": [len(self.env_state_names)],
                "names": list(self.env_state_names),
            }
        for name, names in self.extras.items():
            features[extra_key(name)] = {
                "dtype": "float32",
                "shape": [len(names)],
                "names": list(names),
            }
        features["next.reward"] = {"dtype": "float32", "shape": [1], "names": None}
        features["next.done"] = {"dtype": "bool", "shape": [1], "names": None}
        features["next.success"] = {"dtype": "bool", "shape": [1], "names": None}
        for key, dtype in (
            ("timestamp", "float32"),
            ("frame_index", "int64"),
            ("episode_index", "int64"),
            ("index", "int64"),
            ("task_index", "int64"),
        ):
            features[key] = {"dtype": dtype, "shape": [1], "names": None}
        return features


def frame_timestamps(frame_index: np.ndarray, fps: float) -> np.ndarray:
    """Each frame's time since its episode began, float32 seconds (``frame_index / fps``):
    LeRobot finds a frame's image in the episode's video by this timestamp."""
    return (frame_index / fps).astype(np.float32)


def video_spans(lengths: list[int], fps: float) -> list[tuple[float, float]]:
    """``(from, to)`` seconds of each episode in a video file holding episodes of ``lengths``
    frames back to back: each starts where the previous one ended."""
    spans, start = [], 0
    for length in lengths:
        spans.append((start / fps, (start + length) / fps))
        start += length
    return spans


def finalize(
    root: Path,
    shards: Sequence[Path],
    schema: DatasetSchema,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """Build the v3 layout of ``root`` from ``shards`` (in seed order); return ``info``.

    Every shard is verified against its manifest first, so a corrupt shard leaves an existing
    dataset untouched. The new dataset is built whole beside ``root`` (``meta/checksums.json``
    listing every file, then ``meta/info.json``), ``root``'s ``.staging`` mirrored into it by
    hard links (the committed shards survive the swap; no other process writes there while the
    caller holds the dataset's output lock), then fsynced and swapped in: at every moment
    ``root`` holds the previous complete dataset or the new one. A full disk raises
    :class:`~robo_pipe.errors.OutOfSpaceError` and leaves ``root`` as it was.
    """
    manifests = [read_shard(shard) for shard in shards]
    if not any(manifest.kept for manifest in manifests):
        attempted = sum(len(manifest.episodes) for manifest in manifests)
        raise DatasetError(
            f"{root}: no episodes to write ({attempted} attempted, none kept); "
            "keep failed episodes with collect.keep_failed=true"
        )
    discard_dead_temporaries(root.parent, of=root.name)  # killed finalizes' (never a live one's)
    tree = temporary_path(root)
    with writing(root, tree, kept=FINALIZE_KEPT):
        tree.mkdir()
        info = _build(tree, shards, manifests, schema, provenance)
        _mirror_staging(root / STAGING_DIR, tree / STAGING_DIR)
        replace_dir(tree, root)
    return info


def _build(
    tree: Path,
    shards: Sequence[Path],
    manifests: Sequence[ShardManifest],
    schema: DatasetSchema,
    provenance: dict[str, Any],
) -> dict[str, Any]:
    """Write the v3 files of a dataset of ``shards`` (verified: ``manifests``) into the empty
    directory ``tree``; return ``info``."""
    video_sums: dict[str, FileSum] = {}  # the shards' own digests: videos are not hashed again
    tasks: dict[str, int] = {}
    episode_rows: list[dict[str, Any]] = []
    numeric: dict[str, list[np.ndarray]] = {}
    histograms: dict[str, np.ndarray] = {
        cam: np.zeros((3, 256), np.int64) for cam in schema.cameras
    }
    attempted = solved = 0
    seeds: list[int] = []
    n_episodes = n_frames = file_number = 0

    for shard, manifest in zip(shards, manifests, strict=True):
        attempted += len(manifest.episodes)
        solved += sum(e["success"] for e in manifest.episodes)
        kept = manifest.kept
        if not kept:
            continue
        frames = pq.read_table(shard / FRAMES_FILE)
        lengths = [e["length"] for e in kept]
        if frames.num_rows != sum(lengths):
            raise DatasetError(
                f"{shard / FRAMES_FILE}: {frames.num_rows} rows, manifest says {sum(lengths)}"
            )
        for e in kept:
            tasks.setdefault(e["instruction"], len(tasks))
            seeds.append(int(e["seed"]))
        local_episode = frames.column("episode").to_numpy()
        frame_index = frames.column("frame_index").to_numpy()
        task_of_episode = np.array([tasks[e["instruction"]] for e in kept])
        columns = {
            STATE_KEY: frames.column(STATE_KEY),
            ACTION_KEY: frames.column(ACTION_KEY),
            **(
                {ENV_STATE_KEY: frames.column(ENV_STATE_KEY)}
                if ENV_STATE_KEY in frames.column_names
                else {}
            ),
            **{extra_key(n): frames.column(extra_key(n)) for n in schema.extras},
            "next.reward": frames.column("next.reward"),
            "next.done": frames.column("next.done"),
            "next.success": frames.column("next.success"),
            "timestamp": pa.array(frame_timestamps(frame_index, schema.fps)),
            "frame_index": pa.array(frame_index.astype(np.int64)),
            "episode_index": pa.array((local_episode + n_episodes).astype(np.int64)),
            "index": pa.array(np.arange(n_frames, n_frames + frames.num_rows, dtype=np.int64)),
            "task_index": pa.array(task_of_episode[local_episode].astype(np.int64)),
        }
        data = pa.table(columns)
        where = chunk_file(file_number)
        data_path = tree / DATA_PATH.format(**where)
        write_parquet(data_path, data, FINALIZE_KEPT)
        for key, values in table_to_numpy(data).items():
            numeric.setdefault(key, []).append(
                np.asarray(values, dtype=np.float64).reshape(len(values), -1)
            )

        for cam in schema.cameras:
            video_path = tree / VIDEO_PATH.format(video_key=camera_key(cam), **where)
            _link_into_place(shard / f"{cam}.mp4", video_path)
            rel = video_path.relative_to(tree).as_posix()
            video_sums[rel] = FileSum(video_path.stat().st_size, manifest.files[f"{cam}.mp4"])
            histograms[cam] += np.asarray(manifest.image_histograms[cam], dtype=np.int64)

        spans = video_spans([e["length"] for e in kept], schema.fps)
        start_frame = 0
        for k, e in enumerate(kept):
            row: dict[str, Any] = {
                "episode_index": n_episodes + k,
                "tasks": [e["instruction"]],
                "length": e["length"],
                "data/chunk_index": where["chunk_index"],
                "data/file_index": where["file_index"],
                "dataset_from_index": n_frames + start_frame,
                "dataset_to_index": n_frames + start_frame + e["length"],
            }
            for cam in schema.cameras:
                key = camera_key(cam)
                row[f"videos/{key}/chunk_index"] = where["chunk_index"]
                row[f"videos/{key}/file_index"] = where["file_index"]
                row[f"videos/{key}/from_timestamp"], row[f"videos/{key}/to_timestamp"] = spans[k]
            row["meta/episodes/chunk_index"] = where["chunk_index"]
            row["meta/episodes/file_index"] = where["file_index"]
            episode_rows.append(row)
            start_frame += e["length"]
        episodes_path = tree / EPISODES_PATH.format(**where)
        rows = pa.Table.from_pylist(episode_rows[n_episodes : n_episodes + len(kept)])
        write_parquet(episodes_path, rows, FINALIZE_KEPT)
        n_episodes += len(kept)
        n_frames += frames.num_rows
        file_number += 1

    task_frame = pd.DataFrame(
        {"task_index": list(tasks.values())}, index=pd.Index(list(tasks), name="task")
    )
    tmp_tasks = temporary_path(tree / TASKS_PATH)
    with writing(tree / TASKS_PATH, tmp_tasks, kept=FINALIZE_KEPT):
        task_frame.to_parquet(tmp_tasks)
        os.replace(tmp_tasks, tree / TASKS_PATH)

    stats = {key: numeric_stats(np.concatenate(parts)) for key, parts in numeric.items()}
    for cam, hist in histograms.items():
        stats[camera_key(cam)] = image_stats(hist, schema.image_size**2)
    write_text(tree / STATS_PATH, json.dumps(stats, indent=1), FINALIZE_KEPT)

    full_provenance = {
        **provenance,
        "attempted_episodes": attempted,
        "source_successes": solved,
        "source_success_rate": solved / attempted if attempted else 0.0,
        "episode_seeds": seeds,
    }
    write_text(tree / PROVENANCE_PATH, json.dumps(full_provenance, indent=1), FINALIZE_KEPT)
    info = {
        "codebase_version": CODEBASE_VERSION,
        "fps": schema.fps,
        "features": schema.features(),
        "total_episodes": n_episodes,
        "total_frames": n_frames,
        "total_tasks": len(tasks),
        "chunks_size": CHUNKS_SIZE,
        "data_files_size_in_mb": 100,
        "video_files_size_in_mb": 200,
        "data_path": DATA_PATH,
        "video_path": VIDEO_PATH if schema.cameras else None,
        "robot_type": schema.robot,
        "splits": {"train": f"0:{n_episodes}"},
    }
    # The checksums cover info.json too, so it is written beside first and renamed in last.
    info_path, tmp_info = tree / INFO_PATH, temporary_path(tree / INFO_PATH)
    with writing(info_path, tmp_info, kept=FINALIZE_KEPT):
        tmp_info.write_text(json.dumps(info, indent=4))
        others = [
            p
            for p in dataset_files(tree)
            if p != tmp_info and p.relative_to(tree).as_posix() not in video_sums
        ]
        sums = {**video_sums, **file_sums(tree, others)}
        sums[INFO_PATH] = FileSum(tmp_info.stat().st_size, file_sha256(tmp_info))
        write_checksums(tree, sums, CHECKSUMS_PATH)
        os.replace(tmp_info, info_path)
    return info


def _mirror_staging(staging: Path, copy: Path) -> None:
    """Recreate ``staging`` at ``copy``: its directories, and its files as hard links (copies
    across filesystems), all but the temporaries being written (a shard is immutable once
    committed, so a link is as good as the file)."""
    if not staging.is_dir():
        return
    for folder, dirs, files in os.walk(staging):
        dirs[:] = [d for d in dirs if ".tmp-" not in d]
        here = copy / Path(folder).relative_to(staging)
        here.mkdir(parents=True, exist_ok=True)
        for name in files:
            if ".tmp-" not in name:
                _link(Path(folder, name), here / name)


def _link_into_place(source: Path, target: Path) -> None:
    """Hard-link (or copy, across filesystems) ``source`` to ``target`` in the new tree."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with writing(target, target, kept=FINALIZE_KEPT):  # a full disk is named with this file
        _link(source, target)


def _link(source: Path, target: Path) -> None:
    """Hard-link ``source`` to ``target``, or copy it where a link is impossible."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def numeric_stats(values: np.ndarray) -> dict[str, list[float] | list[int]]:
    """LeRobot-style stats of ``values`` (frames, dims): min/max/mean/std/count/quantiles."""
    stats: dict[str, list[float] | list[int]] = {
        "min": values.min(axis=0).tolist(),
        "max": values.max(axis=0).tolist(),
        "mean": values.mean(axis=0).tolist(),
        "std": values.std(axis=0).tolist(),
        "count": [len(values)],
    }
    for q in QUANTILES:
        stats[f"q{round(q * 100):02d}"] = np.quantile(values, q, axis=0).tolist()
    return stats


def image_stats(histogram: np.ndarray, pixels_per_frame: int) -> dict[str, Any]:
    """Per-channel stats of pixels scaled to [0, 1], shaped (3, 1, 1) as LeRobot stores them.

    Computed exactly from 256-bin histograms, which shards can add up.
    """
    levels = np.arange(256) / 255.0
    total = histogram.sum(axis=1)
    mean = (histogram * levels).sum(axis=1) / total
    var = (histogram * (levels[None, :] - mean[:, None]) ** 2).sum(axis=1) / total
    cdf = np.cumsum(histogram, axis=1) / total[:, None]

    def per_channel(v: np.ndarray) -> list[list[list[float]]]:
        return [[[float(x)]] for x in v]

    stats: dict[str, Any] = {
        "min": per_channel(np.array([levels[np.flatnonzero(h)[0]] for h in histogram])),
        "max": per_channel(np.array([levels[np.flatnonzero(h)[-1]] for h in histogram])),
        "mean": per_channel(mean),
        "std": per_channel(np.sqrt(var)),
        "count": [int(total[0]) // pixels_per_frame],  # frames, as LeRobot counts
    }
    for q in QUANTILES:
        stats[f"q{round(q * 100):02d}"] = per_channel(
            np.array([levels[np.searchsorted(c, q)] for c in cdf])
        )
    return stats
