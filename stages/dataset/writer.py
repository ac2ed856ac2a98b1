"""Writing LeRobot v3 datasets: atomic shards in staging, then a deterministic finalize.

A *shard* is a block of consecutive episode seeds collected by one worker. It is written into a
temporary directory under ``<root>/.staging`` (named after its writer's pid and host), fsynced
and committed by renaming that directory (atomic on POSIX), with ``shard.json`` -- its
manifest, holding the sha256 of every file -- written last. A shard is therefore either wholly
there or not at all: killing collection at any moment loses at most the shards in flight, and a
re-run redoes exactly those. Clean-up removes only the temporaries of dead writers.

:func:`finalize` builds the v3 layout from the committed shards, in seed order, each shard
becoming one data file, one video file per camera and one episodes file. It is a pure function
of the shards, so an interrupted-and-resumed collection ends byte-identical to an uninterrupted
one. The new dataset is built whole beside ``root`` (``meta/checksums.json``, the size and sha256
of every file, then ``meta/info.json`` last), with ``.staging`` mirrored into it by hard links,
then fsynced and swapped in (:func:`~robo_pipe.atomic.replace_dir`): a re-finalize (more
episodes appended) killed at any moment leaves the previous complete dataset loadable, and the
committed shards are kept either way.

A full disk (or file size limit) while writing a shard or finalizing raises
:class:`~robo_pipe.errors.OutOfSpaceError`: the half-written shard or dataset is removed, the
committed shards and the previous dataset stay, and a re-run resumes from them.
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
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from robo_pipe.atomic import (
    discard_dead_temporaries,
    fsync_dir,
    fsync_tree,
    replace_dir,
    temporary_path,
)
from robo_pipe.errors import RoboPipeError
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
    camera_key,
    chunk_file,
    dataset_files,
)
from stages.dataset.video import CODEC, GOP, PIX_FMT, encode_video

SHARD_MANIFEST = "shard.json"
FRAMES_FILE = "frames.parquet"
SHARD_KEPT = "the shards committed before it are kept"
"""What a full disk while writing a shard leaves (:class:`~robo_pipe.errors.OutOfSpaceError`)."""
FINALIZE_KEPT = (
    "the committed shards and the previous dataset (if any) are kept; a re-run finalizes from them"
)
"""What a full disk while finalizing leaves."""


class DatasetError(RoboPipeError, ValueError):
    """A dataset or shard is missing, corrupt or inconsistent; the message names the file."""


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
                    STATE_KEY: _fixed_list(np.concatenate([ep.state for ep in kept])),
                    ACTION_KEY: _fixed_list(np.concatenate([ep.action for ep in kept])),
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
                table = table.append_column(ENV_STATE_KEY, _fixed_list(env_state))
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
        _write_text(tmp / SHARD_MANIFEST, manifest_text, SHARD_KEPT)
    fsync_tree(tmp)  # durable before it is committed: no renamed shard with empty files
    try:
        os.rename(tmp, final)  # the commit
    except OSError:  # another worker committed the same shard first: keep theirs
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        fsync_dir(staging)
    return manifest


def _fixed_list(values: np.ndarray) -> pa.FixedSizeListArray:
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


def _write_text(path: Path, text: str, kept: str = FINALIZE_KEPT) -> None:
    """Write ``path`` whole or not at all (a full disk is named with this file)."""
    tmp = temporary_path(path)
    with writing(path, tmp, kept=kept):
        tmp.write_text(text)
        os.replace(tmp, path)


def _write_parquet(path: Path, table: pa.Table) -> None:
    """Write ``path`` whole or not at all (a full disk is named with this file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    with writing(path, tmp, kept=FINALIZE_KEPT):
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
        _write_parquet(data_path, data)
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
        _write_parquet(
            episodes_path, pa.Table.from_pylist(episode_rows[n_episodes : n_episodes + len(kept)])
        )
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
    _write_text(tree / STATS_PATH, json.dumps(stats, indent=1))

    full_provenance = {
        **provenance,
        "attempted_episodes": attempted,
        "source_successes": solved,
        "source_success_rate": solved / attempted if attempted else 0.0,
        "episode_seeds": seeds,
    }
    _write_text(tree / PROVENANCE_PATH, json.dumps(full_provenance, indent=1))
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
