"""What verifying on every load costs: seconds per GB to verify a dataset and a checkpoint
against their checksums, next to reading the same bytes, and file hashing before and after.

Builds, in a temporary directory, a LeRobot v3 dataset of random 128x128 frames (lossless
video, so about 50 KB a frame: the bytes are what is measured, not the content) through the
collect stage's own writer (``write_shard``, ``finalize``), and a default VLA checkpoint widened
until its weights are of a similar size (``save_policy``). Then, each the best of three runs:

- ``read``: every file of both read in 1 MiB blocks without hashing (the baseline: what any
  loader pays anyway);
- ``hash before``: ``hashlib.sha256(path.read_bytes())``, whole files in memory, as
  ``checkpoint_hash`` did;
- ``hash after``: :func:`robo_pipe.integrity.file_sha256` (``hashlib.file_digest``, streamed);
- ``verify dataset`` / ``verify checkpoint``: :func:`~stages.dataset.layout.verify_dataset`
  and :func:`~stages.policy.checkpoint.verify_checkpoint` (listing, sizes, sha256), in s/GB and
  as a ratio to reading the same bytes; and ``open_dataset`` whole (verification plus the
  structural checks) for scale.

The files were just written, so they are read from the page cache: the figures are the CPU
cost of verifying; on a cold cache reading from disk dominates both sides of the ratio.

Run: ``python benchmarks/integrity.py [--quick] [--mb N]`` (about N MB of each; default 512,
``--quick`` 96); the last line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from robo_pipe.integrity import file_sha256
from stages.dataset.layout import dataset_files, verify_dataset
from stages.dataset.reader import open_dataset
from stages.dataset.shards import EpisodeBuffer, committed_shards, write_shard
from stages.dataset.writer import DatasetSchema, finalize
from stages.policy.checkpoint import (
    new_policy,
    policy_files,
    save_policy,
    verify_checkpoint,
)
from stages.policy.config import PolicyConfig

SIDE = 128
EPISODE_FRAMES = 50
EPISODES_PER_SHARD = 10


def build_dataset(root: Path, megabytes: int) -> None:
    """Shards of noise episodes until the videos hold about ``megabytes`` MB, then finalize."""
    rng = np.random.default_rng(0)
    schema = DatasetSchema(
        robot="rp5",
        fps=10.0,
        state_names=tuple(f"s{i}" for i in range(6)),
        action_names=tuple(f"a{i}" for i in range(6)),
        cameras=("scene",),
        image_size=SIDE,
        crf=0,
    )
    frame_bytes = SIDE * SIDE * 3  # lossless noise does not compress
    episodes = max(EPISODES_PER_SHARD, megabytes * 10**6 // (frame_bytes * EPISODE_FRAMES))
    staging = root / ".staging"
    for start in range(0, episodes, EPISODES_PER_SHARD):
        shard = [
            EpisodeBuffer(
                seed=seed,
                instruction="touch the red cube",
                images={"scene": rng.integers(0, 256, (EPISODE_FRAMES, SIDE, SIDE, 3), np.uint8)},
                state=rng.normal(size=(EPISODE_FRAMES, 6)).astype(np.float32),
                action=rng.normal(size=(EPISODE_FRAMES, 6)).astype(np.float32),
                reward=np.zeros(EPISODE_FRAMES, np.float32),
                done=np.arange(EPISODE_FRAMES) == EPISODE_FRAMES - 1,
                success=np.arange(EPISODE_FRAMES) == EPISODE_FRAMES - 1,
            )
            for seed in range(start, start + EPISODES_PER_SHARD)
        ]
        write_shard(staging, start, start + EPISODES_PER_SHARD, shard, True, 10.0, 0)
    shards = committed_shards(root)
    finalize(root, [shards[key] for key in sorted(shards)], schema, {"benchmark": "integrity"})


def build_checkpoint(directory: Path, megabytes: int) -> None:
    """A default VLA whose weights are about ``megabytes`` MB (float32), saved."""
    layers = 4
    d_model = 64
    while 12 * layers * d_model**2 * 4 < megabytes * 10**6:  # ~12 d^2 weights per layer
        d_model += 64
    config = PolicyConfig(d_model=d_model, n_layers=layers, n_heads=4)
    policy, _ = new_policy(config, ["scene"], 64, "rp5", 6, 6)
    save_policy(policy, directory, None)


def best_of(runs: int, measure: Callable[[], object]) -> float:
    """Fastest wall time of ``runs`` calls, seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        measure()
        times.append(time.perf_counter() - start)
    return min(times)


def read_all(files: list[Path]) -> None:
    """Read every byte in 1 MiB blocks, as a loader would, without hashing."""
    block = bytearray(1 << 20)
    for path in files:
        with path.open("rb", buffering=0) as f:
            while f.readinto(block):
                pass


def hash_before(files: list[Path]) -> None:
    """Whole files in memory, then sha256 (``checkpoint_hash`` before this benchmark)."""
    for path in files:
        hashlib.sha256(path.read_bytes()).hexdigest()


def hash_after(files: list[Path]) -> None:
    """Streamed sha256 (``robo_pipe.integrity.file_sha256``)."""
    for path in files:
        file_sha256(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 96 MB of each")
    parser.add_argument("--mb", type=int, default=512, help="about this many MB of each")
    args = parser.parse_args()
    megabytes = 96 if args.quick else args.mb
    with tempfile.TemporaryDirectory(prefix="robo-pipe-integrity-") as tmp:
        dataset, checkpoint = Path(tmp) / "ds", Path(tmp) / "ckpt"
        start = time.perf_counter()
        build_dataset(dataset, megabytes)
        build_checkpoint(checkpoint, megabytes)
        built = time.perf_counter() - start
        data_files, ckpt_files = dataset_files(dataset), policy_files(checkpoint)
        everything = data_files + ckpt_files
        mb = {
            "all": sum(p.stat().st_size for p in everything) / 1e6,
            "dataset": sum(p.stat().st_size for p in data_files) / 1e6,
            "checkpoint": sum(p.stat().st_size for p in ckpt_files) / 1e6,
        }
        read_all(everything)  # into the page cache once, untimed
        runs: list[tuple[str, str, Callable[[], object]]] = [  # (name, bytes it covers, what)
            ("read", "all", lambda: read_all(everything)),
            ("hash before", "all", lambda: hash_before(everything)),
            ("hash after", "all", lambda: hash_after(everything)),
            ("read dataset", "dataset", lambda: read_all(data_files)),
            ("verify dataset", "dataset", lambda: verify_dataset(dataset)),
            ("open_dataset", "dataset", lambda: open_dataset(dataset)),
            ("read checkpoint", "checkpoint", lambda: read_all(ckpt_files)),
            ("verify checkpoint", "checkpoint", lambda: verify_checkpoint(checkpoint)),
        ]
        seconds = {name: best_of(3, measure) for name, _, measure in runs}
    print(
        f"dataset {mb['dataset']:.0f} MB in {len(data_files)} files, checkpoint "
        f"{mb['checkpoint']:.0f} MB in {len(ckpt_files)} files (built in {built:.0f} s); "
        "page cache warm, best of 3"
    )
    print(f"{'':<18} {'seconds':>8} {'MB/s':>8} {'s/GB':>7}")
    for name, covers, _ in runs:
        size = mb[covers]
        print(
            f"{name:<18} {seconds[name]:>8.3f} {size / seconds[name]:>8.0f} "
            f"{seconds[name] / size * 1e3:>7.2f}"
        )
    figures = {
        "dataset_verify_s_per_gb": seconds["verify dataset"] / mb["dataset"] * 1e3,
        "checkpoint_verify_s_per_gb": seconds["verify checkpoint"] / mb["checkpoint"] * 1e3,
        "dataset_open_s_per_gb": seconds["open_dataset"] / mb["dataset"] * 1e3,
        "read_mb_s": mb["all"] / seconds["read"],
        "hash_mb_s_before": mb["all"] / seconds["hash before"],
        "hash_mb_s_after": mb["all"] / seconds["hash after"],
        "dataset_verify_vs_read": seconds["verify dataset"] / seconds["read dataset"],
        "checkpoint_verify_vs_read": seconds["verify checkpoint"] / seconds["read checkpoint"],
    }
    print(" ".join(f"{k}={v:.3g}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
