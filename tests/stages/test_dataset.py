"""LeRobot v3 writing and reading: round trip, validation of corrupt files, statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from stages.dataset.layout import INFO_PATH, STATS_PATH, content_hash
from stages.dataset.reader import open_dataset
from stages.dataset.video import decode_video, encode_video
from stages.dataset.writer import (
    DatasetError,
    DatasetSchema,
    EpisodeBuffer,
    committed_shards,
    finalize,
    write_shard,
)

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


def test_finalize_is_deterministic(
    synthetic: tuple[Path, list[EpisodeBuffer]], tmp_path: Path
) -> None:
    root, _ = synthetic
    first = content_hash(root)
    shards = committed_shards(root)
    finalize(root, [shards[(0, 3)], shards[(3, 6)]], SCHEMA, {"note": "again"})
    assert content_hash(root) == first


def test_truncated_data_file_is_named(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    data = root / "data/chunk-000/file-001.parquet"
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(DatasetError, match=r"file-001\.parquet: unreadable parquet"):
        open_dataset(root)


def test_truncated_video_is_named(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    video = root / "videos/observation.images.scene/chunk-000/file-000.mp4"
    video.write_bytes(video.read_bytes()[: video.stat().st_size // 2])
    with pytest.raises(DatasetError, match=r"file-000\.mp4"):
        open_dataset(root)


def test_missing_info_and_inconsistent_counts(synthetic: tuple[Path, list[EpisodeBuffer]]) -> None:
    root, _ = synthetic
    info = json.loads((root / INFO_PATH).read_text())
    info["total_frames"] += 1
    (root / INFO_PATH).write_text(json.dumps(info))
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
