"""Reading LeRobot v3 datasets with validation: every problem names the file and what is wrong.

:func:`open_dataset` checks every file against ``meta/checksums.json`` (size and sha256, each
file read once), then the schema and the counts before anything is used: info.json, tasks, the
episodes index, every data file (readable, the rows the index says, the columns the features
say) and every video file (readable, as many frames as the episodes it holds). Training (and
anything else) then reads arrays through :class:`LeRobotDataset`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from robo_pipe.integrity import FileSum
from stages.dataset.layout import (
    ACTION_KEY,
    CODEBASE_VERSION,
    IMAGE_PREFIX,
    INFO_PATH,
    PROVENANCE_PATH,
    STATE_KEY,
    STATS_PATH,
    TASKS_PATH,
    DatasetError,
    DatasetRef,
    camera_key,
    content_hash,
    verify_dataset,
)
from stages.dataset.shards import table_to_numpy
from stages.dataset.video import VideoError, count_frames, decode_video
from stages.dataset.writer import image_stats, numeric_stats

_REQUIRED_INFO = (
    "codebase_version",
    "fps",
    "features",
    "total_episodes",
    "total_frames",
    "data_path",
)


def _read_parquet(path: Path) -> pa.Table:
    if not path.is_file():
        raise DatasetError(f"{path}: file missing")
    try:
        return pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise DatasetError(f"{path}: unreadable parquet (truncated or corrupt): {err}") from err


@dataclass
class LeRobotDataset:
    """A validated v3 dataset on disk (see :func:`open_dataset`)."""

    root: Path
    info: dict[str, Any]
    stats: dict[str, Any]
    tasks: list[str]
    """Instruction text by task_index."""
    episodes: pd.DataFrame
    """One row per episode (meta/episodes), ordered by episode_index."""
    provenance: dict[str, Any]
    checksums: dict[str, FileSum]
    """The verified size and sha256 of every file (``meta/checksums.json``)."""

    @property
    def fps(self) -> float:
        """Frames per second (= the robot's control rate)."""
        return float(self.info["fps"])

    @property
    def cameras(self) -> list[str]:
        """Camera names with a video stream."""
        return [
            k.removeprefix(IMAGE_PREFIX)
            for k in self.info["features"]
            if k.startswith(IMAGE_PREFIX)
        ]

    @property
    def num_frames(self) -> int:
        """Total frames."""
        return int(self.info["total_frames"])

    @property
    def num_episodes(self) -> int:
        """Total episodes."""
        return int(self.info["total_episodes"])

    def _data_files(self) -> list[Path]:
        keys = self.episodes[["data/chunk_index", "data/file_index"]].drop_duplicates()
        return [
            self.root / self.info["data_path"].format(chunk_index=int(c), file_index=int(f))
            for c, f in keys.itertuples(index=False)
        ]

    def frames(self) -> dict[str, np.ndarray]:
        """Every non-video feature as an array over all frames, in ``index`` order.

        ``observation.state`` and ``action`` are float32 (frames, dim); scalar features (frames,).
        """
        return table_to_numpy(pa.concat_tables([_read_parquet(p) for p in self._data_files()]))

    def camera_frames(self, camera: str) -> np.ndarray:
        """Decoded frames of one camera over the whole dataset: uint8 (frames, H, W, 3)."""
        key = camera_key(camera)
        files = self.episodes[
            [f"videos/{key}/chunk_index", f"videos/{key}/file_index"]
        ].drop_duplicates()
        template = self.info["video_path"]
        parts = [
            decode_video(
                self.root / template.format(video_key=key, chunk_index=int(c), file_index=int(f))
            )
            for c, f in files.itertuples(index=False)
        ]
        return np.concatenate(parts)

    def recompute_stats(self) -> dict[str, Any]:
        """Statistics recomputed from the data and decoded videos (same layout as stats.json)."""
        stats: dict[str, Any] = {}
        for key, values in self.frames().items():
            stats[key] = numeric_stats(
                np.asarray(values, dtype=np.float64).reshape(len(values), -1)
            )
        for cam in self.cameras:
            frames = self.camera_frames(cam)
            hist = np.stack([np.bincount(frames[..., c].ravel(), minlength=256) for c in range(3)])
            stats[camera_key(cam)] = image_stats(hist, frames.shape[1] * frames.shape[2])
        return stats

    def compare_stats(self, atol: float = 1e-4, image_atol: float = 0.01) -> list[str]:
        """Differences between stats.json and recomputed stats; empty when they agree.

        Image stats come from the frames before encoding, so they are compared with the codec's
        tolerance ``image_atol`` (in [0, 1] pixel units).
        """
        problems = []
        fresh = self.recompute_stats()
        for key, stored in self.stats.items():
            if key not in fresh:
                problems.append(f"{key}: in stats.json but not in the data")
                continue
            tol = image_atol if key.startswith(IMAGE_PREFIX) else atol
            for stat in ("min", "max", "mean", "std"):
                a, b = np.asarray(stored[stat], float), np.asarray(fresh[key][stat], float)
                if a.shape != b.shape or not np.allclose(a, b, atol=tol):
                    problems.append(
                        f"{key}.{stat}: stats.json {a.ravel()[:4]} vs data {b.ravel()[:4]}"
                    )
        return problems

    def content_hash(self) -> str:
        """sha256 of the v3 files (see :func:`stages.dataset.layout.content_hash`), from the
        digests verified when the dataset was opened (no second read)."""
        return content_hash(self.root, self.checksums)


def open_dataset(root: str | Path, check_videos: bool = True) -> LeRobotDataset:
    """Open and validate the dataset at ``root``.

    Raises:
        IntegrityError: a file differs from ``meta/checksums.json`` (missing, unlisted, size,
            sha256), or the dataset has no checksums; naming the file and the check.
        DatasetError: naming the file and the problem -- missing/incomplete metadata, wrong
            codebase version, unreadable or truncated parquet/video, counts that disagree.
    """
    root = Path(root)
    info_path = root / INFO_PATH
    if not root.is_dir():
        raise DatasetError(f"{root}: dataset directory not found")
    if not info_path.is_file():
        raise DatasetError(
            f"{info_path}: missing: not a dataset, or an interrupted collection "
            "(re-run robo-pipe collect with the same config to finish it)"
        )
    checksums = verify_dataset(root)  # before anything reads the files
    try:
        info = json.loads(info_path.read_text())
    except ValueError as err:
        raise DatasetError(f"{info_path}: not valid JSON: {err}") from err
    missing = [k for k in _REQUIRED_INFO if k not in info]
    if missing:
        raise DatasetError(f"{info_path}: missing fields {', '.join(missing)}")
    if info["codebase_version"] != CODEBASE_VERSION:
        raise DatasetError(
            f"{info_path}: codebase_version {info['codebase_version']!r}, "
            f"expected {CODEBASE_VERSION!r}"
        )

    stats_path = root / STATS_PATH
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, ValueError) as err:
        raise DatasetError(f"{stats_path}: missing or not valid JSON: {err}") from err
    tasks_table = _read_parquet(root / TASKS_PATH).to_pandas()
    tasks = [str(t) for t in tasks_table.sort_values("task_index").index]

    episode_files = sorted((root / "meta/episodes").glob("chunk-*/file-*.parquet"))
    if not episode_files:
        raise DatasetError(f"{root / 'meta/episodes'}: no episode index files")
    episodes = pd.concat([_read_parquet(p).to_pandas() for p in episode_files], ignore_index=True)
    episodes = episodes.sort_values("episode_index", ignore_index=True)
    if len(episodes) != info["total_episodes"]:
        raise DatasetError(
            f"{root / 'meta/episodes'}: {len(episodes)} episodes, "
            f"info.json says {info['total_episodes']}"
        )
    if not np.array_equal(episodes["episode_index"].to_numpy(), np.arange(len(episodes))):
        raise DatasetError(f"{root / 'meta/episodes'}: episode_index is not 0..{len(episodes) - 1}")
    if int(episodes["length"].sum()) != info["total_frames"]:
        raise DatasetError(
            f"{root / 'meta/episodes'}: episode lengths sum to {int(episodes['length'].sum())}, "
            f"info.json says total_frames={info['total_frames']}"
        )

    features = info["features"]
    for key in (STATE_KEY, ACTION_KEY):
        if key not in features:
            raise DatasetError(f"{info_path}: feature {key!r} missing")
    dataset = LeRobotDataset(
        root=root,
        info=info,
        stats=stats,
        tasks=tasks,
        episodes=episodes,
        provenance=_read_provenance(root),
        checksums=checksums,
    )
    _check_data_files(dataset)
    if check_videos:
        _check_videos(dataset)
    return dataset


def dataset_ref(out: Path, robot: str, variant: str, source: str) -> DatasetRef:
    """The record of the finished dataset at ``out`` (opened and verified)."""
    dataset = open_dataset(out)
    return DatasetRef(
        path=str(out),
        content_hash=dataset.content_hash(),
        episodes=dataset.num_episodes,
        frames=dataset.num_frames,
        fps=dataset.fps,
        robot=robot,
        variant=variant,
        features={
            k: {"dtype": f["dtype"], "shape": f["shape"]}
            for k, f in dataset.info["features"].items()
        },
        source=source,
        source_success_rate=float(dataset.provenance.get("source_success_rate", 0.0)),
    )


def _read_provenance(root: Path) -> dict[str, Any]:
    path = root / PROVENANCE_PATH
    if not path.is_file():
        return {}
    try:
        data: dict[str, Any] = json.loads(path.read_text())
        return data
    except ValueError as err:
        raise DatasetError(f"{path}: not valid JSON: {err}") from err


def _check_data_files(dataset: LeRobotDataset) -> None:
    eps = dataset.episodes
    columns = [k for k, f in dataset.info["features"].items() if f["dtype"] != "video"]
    for (chunk, file), group in eps.groupby(["data/chunk_index", "data/file_index"]):
        path = dataset.root / dataset.info["data_path"].format(
            chunk_index=int(chunk), file_index=int(file)
        )
        if not path.is_file():
            raise DatasetError(f"{path}: data file missing")
        try:
            meta = pq.read_metadata(path)
        except (pa.ArrowInvalid, OSError) as err:
            raise DatasetError(f"{path}: unreadable parquet (truncated or corrupt): {err}") from err
        expected = int(group["length"].sum())
        if meta.num_rows != expected:
            raise DatasetError(f"{path}: {meta.num_rows} frames, the episode index says {expected}")
        arrow_schema = meta.schema.to_arrow_schema()
        names = set(arrow_schema.names)
        absent = [c for c in columns if c not in names]
        if absent:
            raise DatasetError(f"{path}: columns {', '.join(absent)} missing")
        for key in (STATE_KEY, ACTION_KEY):
            width = dataset.info["features"][key]["shape"][0]
            field = arrow_schema.field(key)
            if not pa.types.is_fixed_size_list(field.type) or field.type.list_size != width:
                raise DatasetError(
                    f"{path}: column {key!r} is {field.type}, features say {width} values"
                )


def _check_videos(dataset: LeRobotDataset) -> None:
    template = dataset.info.get("video_path")
    for cam in dataset.cameras:
        key = camera_key(cam)
        cols = [f"videos/{key}/chunk_index", f"videos/{key}/file_index"]
        if any(c not in dataset.episodes for c in cols):
            raise DatasetError(f"{dataset.root / 'meta/episodes'}: no video index for {key}")
        for (chunk, file), group in dataset.episodes.groupby(cols):
            path = dataset.root / str(template).format(
                video_key=key, chunk_index=int(chunk), file_index=int(file)
            )
            if not path.is_file():
                raise DatasetError(f"{path}: video file missing")
            try:
                frames = count_frames(path)
            except VideoError as err:
                raise DatasetError(str(err)) from err
            expected = int(group["length"].sum())
            if frames != expected:
                raise DatasetError(
                    f"{path}: {frames} frames, the episode index says {expected} (truncated?)"
                )
