"""LeRobot v3 writing and reading: round trip, checksums and validation of corrupt files,
statistics, a disk that fills up."""

from __future__ import annotations

import errno
import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from robo_pipe.errors import OutOfSpaceError
from robo_pipe.integrity import IntegrityError, file_sums, write_checksums
from stages.dataset import shards as shard_writer
from stages.dataset import writer
from stages.dataset.layout import (
    CHECKSUMS_PATH,
    INFO_PATH,
    STATS_PATH,
    DatasetError,
    content_hash,
    dataset_files,
)
from stages.dataset.reader import open_dataset
from stages.dataset.shards import EpisodeBuffer, committed_shards, write_shard
from stages.dataset.video import decode_video, encode_video
from stages.dataset.writer import DatasetSchema, finalize, frame_timestamps, video_spans
from tests.robo_pipe.test_atomic import dead_pid, kill_at_every_step, live_process

SCHEMA = DatasetSchema(
    robot="rp5",
    fps=10.0,
    state_names=("a", "b", "c"),
    action_names=("x", "y"),
    cameras=("scene",),
    image_size=16,
    crf=0,
)


def synthetic_episode(
    rng: np.random.Generator, seed: int, length: int, solved: bool
) -> EpisodeBuffer:
    # Smooth images (a moving bright square on a gradient), like camera frames, not noise.
    frames = np.zeros((length, 16, 16, 3), np.uint8)
    frames[..., 0] = np.linspace(0, 200, 16, dtype=np.uint8)[None, None, :]
    for t in range(length):
        frames[t, 4 + t % 8 : 8 + t % 8, 3:7] = (250, 40, 30)
    success = np.zeros(length, bool)
    success[-1] = solved
    return EpisodeBuffer(
        seed=seed,
        instruction=f"touch the {'red' if seed % 2 else 'blue'} cube",
        images={"scene": frames},
        state=rng.normal(size=(length, 3)).astype(np.float32),
        action=rng.normal(size=(length, 2)).astype(np.float32),
        reward=rng.normal(size=length).astype(np.float32),
        done=success.copy(),
        success=success,
    )


@pytest.fixture()
def synthetic(tmp_path: Path) -> tuple[Path, list[EpisodeBuffer]]:
    rng = np.random.default_rng(0)
    episodes = [synthetic_episode(rng, s, 3 + s, solved=s != 2) for s in range(6)]
    root = tmp_path / "ds"
    staging = root / ".staging"
    write_shard(staging, 0, 3, episodes[:3], keep_failed=False, fps=10.0, crf=0)
    write_shard(staging, 3, 6, episodes[3:], keep_failed=False, fps=10.0, crf=0)
    shards = committed_shards(root)
    finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {"note": "test"})
    return root, [ep for ep in episodes if ep.solved]


def test_round_trip_states_actions_and_frames(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, kept = synthetic
    ds = open_dataset(root)
    assert ds.num_episodes == 5  # the failed episode (seed 2) was dropped
    assert ds.num_frames == sum(ep.length for ep in kept)
    frames = ds.frames()
    np.testing.assert_array_equal(
        frames["observation.state"], np.concatenate([e.state for e in kept])
    )
    np.testing.assert_array_equal(frames["action"], np.concatenate([e.action for e in kept]))
    np.testing.assert_array_equal(frames["index"], np.arange(ds.num_frames))
    images = ds.camera_frames("scene")
    expected = np.concatenate([e.images["scene"] for e in kept])
    assert images.shape == expected.shape
    assert np.abs(images.astype(int) - expected).max() <= 3  # lossless YUV, RGB rounding only
    assert ds.tasks == ["touch the blue cube", "touch the red cube"]
    assert ds.provenance["attempted_episodes"] == 6
    assert ds.provenance["source_success_rate"] == pytest.approx(5 / 6)
    assert ds.compare_stats() == []


def test_timestamps_are_frame_index_over_fps_across_episode_boundaries(
    synthetic: tuple[Path, list[EpisodeBuffer]],
) -> None:
    """LeRobot v3 seeks video frames by timestamp: every frame's ``timestamp`` is its index in
    its episode divided by fps (10 Hz here), and each episode's video span starts where the
    previous episode in the same file ended."""
    import pyarrow.parquet as pq

    root, _ = synthetic  # kept episodes: lengths 3, 4 in file 0; 6, 7, 8 in file 1
    data = [pq.read_table(root / f"data/chunk-000/file-00{i}.parquet") for i in (0, 1)]
    assert data[0]["frame_index"].to_pylist() == [0, 1, 2, 0, 1, 2, 3]
    assert data[0]["episode_index"].to_pylist() == [0, 0, 0, 1, 1, 1, 1]
    np.testing.assert_allclose(
        data[0]["timestamp"].to_numpy(), [0.0, 0.1, 0.2, 0.0, 0.1, 0.2, 0.3], rtol=1e-6
    )
    frame_index = data[1]["frame_index"].to_numpy()
    assert frame_index.tolist() == [*range(6), *range(7), *range(8)]
    np.testing.assert_allclose(data[1]["timestamp"].to_numpy(), frame_index / 10.0, rtol=1e-6)
    assert all(t["timestamp"].type == "float" for t in data)  # float32, as LeRobot declares
    episodes = [pq.read_table(root / f"meta/episodes/chunk-000/file-00{i}.parquet") for i in (0, 1)]
    key = "videos/observation.images.scene"
    assert episodes[0][f"{key}/from_timestamp"].to_pylist() == pytest.approx([0.0, 0.3])
    assert episodes[0][f"{key}/to_timestamp"].to_pylist() == pytest.approx([0.3, 0.7])
    assert episodes[1][f"{key}/from_timestamp"].to_pylist() == pytest.approx([0.0, 0.6, 1.3])
    assert episodes[1][f"{key}/to_timestamp"].to_pylist() == pytest.approx([0.6, 1.3, 2.1])


def test_timestamp_and_video_span_rules() -> None:
    stamps = frame_timestamps(np.array([0, 1, 2, 0, 1, 2, 3]), fps=30.0)
    assert stamps.dtype == np.float32
    np.testing.assert_allclose(stamps, [0, 1 / 30, 2 / 30, 0, 1 / 30, 2 / 30, 3 / 30], rtol=1e-6)
    spans = np.array(video_spans([3, 4, 1], fps=10.0))
    np.testing.assert_allclose(spans, [(0.0, 0.3), (0.3, 0.7), (0.7, 0.8)], rtol=1e-12)
    assert video_spans([], fps=10.0) == []


def test_finalize_is_deterministic(
    synthetic: tuple[Path, list[EpisodeBuffer]], tmp_path: Path
) -> None:
    root, _ = synthetic
    first = content_hash(root)
    shards = committed_shards(root)
    finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {"note": "again"})
    assert content_hash(root) == first


def rewrite_checksums(root: Path) -> None:
    """Record the dataset's files as they are now: what a writer with a bug would leave, so
    that the structural checks behind the checksums are tested too."""
    write_checksums(root, file_sums(root, dataset_files(root)), CHECKSUMS_PATH)


def flip_byte(path: Path) -> None:
    """Change one byte in the middle of ``path``; its size stays."""
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_truncated_data_file_is_named(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    data = root / "data/chunk-000/file-001.parquet"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(IntegrityError, match=r"file-001\.parquet: size check failed") as err:
        open_dataset(root)
    assert (err.value.path, err.value.check) == (data, "size")
    rewrite_checksums(root)  # the structural check stays behind the checksums
    with pytest.raises(DatasetError, match=r"file-001\.parquet: unreadable parquet"):
        open_dataset(root)


def test_truncated_video_is_named(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    video = root / "videos/observation.images.scene/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    with pytest.raises(IntegrityError, match=r"file-000\.mp4: size check failed"):
        open_dataset(root)
    rewrite_checksums(root)
    with pytest.raises(DatasetError, match=r"file-000\.mp4"):
        open_dataset(root)


@pytest.mark.parametrize(
    "rel",
    [
        "data/chunk-000/file-000.parquet",
        "videos/observation.images.scene/chunk-000/file-001.mp4",
        "meta/episodes/chunk-000/file-000.parquet",
        INFO_PATH,
        "meta/robo_pipe.json",
    ],
)
def test_a_flipped_byte_in_any_dataset_file_is_refused_naming_it(
    synthetic: tuple[Path, list[EpisodeBuffer]], rel: str
) -> None:
    root, _ = synthetic
    flip_byte(root / rel)
    with pytest.raises(
        IntegrityError, match=r"sha256 check failed.*re-run robo-pipe collect"
    ) as err:
        open_dataset(root, check_videos=False)
    assert (err.value.path, err.value.check) == (root / rel, "sha256")


def test_a_missing_or_added_file_and_missing_checksums_are_refused(
    synthetic: tuple[Path, list[EpisodeBuffer]],
) -> None:
    root, kept = synthetic
    (root / "data/chunk-000/file-009.parquet").write_bytes(b"not part of it")
    with pytest.raises(IntegrityError, match=r"file-009\.parquet: unlisted check failed"):
        open_dataset(root)
    (root / "data/chunk-000/file-009.parquet").unlink()
    (root / "meta/tasks.parquet").unlink()
    with pytest.raises(IntegrityError, match=r"tasks\.parquet: missing check failed"):
        open_dataset(root)
    (root / CHECKSUMS_PATH).unlink()
    with pytest.raises(IntegrityError, match=r"no checksums.*re-run robo-pipe collect") as err:
        open_dataset(root)
    assert err.value.check == "checksums"
    shards = committed_shards(root)  # what the message says: finalizing again repairs it
    finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {"note": "test"})
    assert open_dataset(root).num_episodes == len(kept)


def test_the_content_hash_comes_from_the_verified_digests(
    synthetic: tuple[Path, list[EpisodeBuffer]],
) -> None:
    root, _ = synthetic
    dataset = open_dataset(root)
    assert set(dataset.checksums) == {p.relative_to(root).as_posix() for p in dataset_files(root)}
    assert dataset.content_hash() == content_hash(root)


def _fail_after_writing(real: Callable[..., Any], code: int) -> Callable[..., Any]:
    """``real``, except that it then fails as a full disk does: part of the file is there."""

    def fail(*args: Any, **kwargs: Any) -> None:
        real(*args, **kwargs)
        raise OSError(code, "No space left on device")

    return fail


def test_a_full_disk_while_finalizing_keeps_the_previous_dataset(
    synthetic: tuple[Path, list[EpisodeBuffer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = synthetic
    before = content_hash(root)
    shards = committed_shards(root)
    monkeypatch.setattr(writer.pq, "write_table", _fail_after_writing(writer.pq.write_table, 28))
    with pytest.raises(OutOfSpaceError, match=r"file-000\.parquet: the disk is full") as err:
        finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {"note": "test"})
    assert err.value.errno == errno.ENOSPC and "re-run the same command" in str(err.value)
    assert not [p for p in root.parent.rglob("*") if ".tmp-" in p.name], "no partial file left"
    assert content_hash(open_dataset(root).root) == before, "the previous dataset, whole"
    monkeypatch.undo()  # space freed: the re-run finalizes from the same committed shards
    finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {"note": "test"})
    assert content_hash(root) == before and open_dataset(root).num_episodes == 5


def test_a_full_disk_while_writing_a_shard_keeps_the_committed_ones(
    synthetic: tuple[Path, list[EpisodeBuffer]], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, _ = synthetic
    staging = root / ".staging"
    committed = {p.name: p.stat().st_mtime_ns for p in staging.iterdir()}
    episodes = [synthetic_episode(np.random.default_rng(1), s, 4, True) for s in (6, 7)]
    monkeypatch.setattr(
        shard_writer, "encode_video", _fail_after_writing(shard_writer.encode_video, 27)
    )
    with pytest.raises(OutOfSpaceError, match=r"shard-00000006-00000008.*the shards committed"):
        write_shard(staging, 6, 8, episodes, keep_failed=False, fps=10.0, crf=0)
    assert {p.name: p.stat().st_mtime_ns for p in staging.iterdir()} == committed
    open_dataset(root)


def test_missing_info_and_inconsistent_counts(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    info = json.loads((root / INFO_PATH).read_text())
    info["total_frames"] += 1
    (root / INFO_PATH).write_text(json.dumps(info))
    with pytest.raises(IntegrityError, match=r"info\.json: (size|sha256) check failed"):
        open_dataset(root)
    rewrite_checksums(root)
    with pytest.raises(DatasetError, match="total_frames"):
        open_dataset(root)
    (root / INFO_PATH).unlink()
    with pytest.raises(DatasetError, match=r"info\.json: missing.*interrupted collection"):
        open_dataset(root)


def test_tampered_stats_are_detected(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    stats = json.loads((root / STATS_PATH).read_text())
    stats["action"]["mean"][0] += 0.5
    (root / STATS_PATH).write_text(json.dumps(stats))
    with pytest.raises(IntegrityError, match=r"stats\.json: (size|sha256) check failed"):
        open_dataset(root)
    rewrite_checksums(root)
    problems = open_dataset(root).compare_stats()
    assert any(p.startswith("action.mean") for p in problems)


def test_corrupt_shard_never_replaces_a_good_dataset(
    synthetic: tuple[Path, list[EpisodeBuffer]],
) -> None:
    root, _ = synthetic
    before = content_hash(root)
    shards = committed_shards(root)
    (shards[(3, 6)] / "frames.parquet").write_bytes(b"garbage")
    with pytest.raises(DatasetError, match=r"frames\.parquet: corrupt \(sha256"):
        finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {})
    assert content_hash(root) == before
    open_dataset(root)  # still complete and valid


def test_video_codec_round_trip_is_exact_enough(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    frames = rng.integers(0, 256, size=(5, 32, 32, 3), dtype=np.uint8)
    encode_video(frames, tmp_path / "a.mp4", fps=10, crf=0)
    encode_video(frames, tmp_path / "b.mp4", fps=10, crf=0)
    assert (tmp_path / "a.mp4").read_bytes() == (tmp_path / "b.mp4").read_bytes()
    decoded = decode_video(tmp_path / "a.mp4")
    assert decoded.shape == frames.shape
    assert np.abs(decoded.astype(int) - frames).max() <= 3


def test_a_finalize_killed_at_any_step_leaves_a_complete_dataset_and_the_shards(
    synthetic: tuple[Path, list[EpisodeBuffer]],
) -> None:
    """Appending a shard re-finalizes; a kill before any file operation of it (forked child,
    SIGKILL) leaves the previous dataset or the new one, complete, and every committed shard."""
    root, episodes = synthetic
    more = [synthetic_episode(np.random.default_rng(2), s, 4, True) for s in (6, 7)]
    write_shard(root / ".staging", 6, 8, more, keep_failed=False, fps=10.0, crf=0)
    shards = committed_shards(root)
    staging = sorted(p.relative_to(root).as_posix() for p in (root / ".staging").rglob("*"))
    seen: set[int] = set()

    def check(step: int) -> None:
        dataset = open_dataset(root)  # verified against its checksums
        seen.add(dataset.num_episodes)
        assert dataset.content_hash() == content_hash(root)
        now = sorted(p.relative_to(root).as_posix() for p in (root / ".staging").rglob("*"))
        assert now == staging, f"step {step}: the staging area survives"
        shard_writer.discard_uncommitted(root)  # the killed child's temporaries
        assert sorted(os.listdir(root.parent)) == ["ds"], f"step {step}"

    kills = kill_at_every_step(
        lambda: finalize(root, [shards[k] for k in sorted(shards)], SCHEMA, {}), check
    )
    assert kills > 20 and seen == {len(episodes), len(episodes) + 2}


def test_clean_up_spares_a_live_writers_shard(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    staging, host = root / ".staging", socket.gethostname()
    with live_process() as pid:
        live = staging / f".shard-00000006-00000008.tmp-{pid}@{host}.0123abcd"
        dead = staging / f".shard-00000008-00000010.tmp-{dead_pid()}@{host}.0123abcd"
        for path in (live, dead):
            path.mkdir()
            (path / "frames.parquet").write_bytes(b"half")
        assert shard_writer.discard_uncommitted(root) == 1
        assert live.is_dir() and not dead.exists()
