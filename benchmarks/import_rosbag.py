"""Import throughput of ``robo-pipe import rosbag`` on a bag of the published target's shape:
a 30 Hz 640x480 camera, 100 Hz joint states and a 200 Hz IMU, in one zstd-compressed MCAP of
about 1 GB (``--quick``: 100 MB), aligned to the robot's 10 Hz (every third image).

The target (microsoft/physical-ai-toolchain #38): under 5 minutes per GB, i.e. 0.2 GB/min.
Issue 51's bar: at least 1 GB/min on 2 cores (five times the target).

Measured, in the same run:
- ``read``: every message of the bag read and decompressed with rosbags, nothing decoded (the
  floor any importer pays);
- ``import``: ``robo-pipe import rosbag`` in its own process, end to end (checks, decoding,
  alignment, the dataset's videos and parquet, checksums), its peak memory (max RSS).

The images are a moving gradient with sensor noise, so zstd compresses them as it would a
camera's (about 2x), not as it would noise (1x) or a flat colour (100x).

Run: ``python benchmarks/import_rosbag.py [--quick] [--mb N]``; the last line is ``key=value``.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from robots.ros2.bags import BagWriter
from robots.spec import get_robot

ROOT = Path(__file__).resolve().parents[1]
WIDTH, HEIGHT = 640, 480
TARGET_GB_PER_MIN = 0.2


def make_bag(path: Path, megabytes: int) -> tuple[int, float]:
    """A bag of about ``megabytes`` MB on disk; returns (messages, seconds of recording)."""
    rp5 = get_robot("rp5")
    joints = [j.name for j in (*rp5.arm, *rp5.gripper)]
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:HEIGHT, 0:WIDTH]
    t0 = 1_767_225_600 * 1_000_000_000
    messages, step = 0, 0
    with BagWriter(path) as bag:
        while True:
            ns = (
                t0 + step * 5_000_000
            )  # a 200 Hz clock: IMU each tick, joints every 2nd, camera every ~6.67th
            bag.imu("/imu", ns + 300_000, rng.normal(size=3), rng.normal(size=3))
            messages += 1
            if step % 2 == 0:
                positions = np.sin(step / 200 + np.arange(len(joints)))
                bag.joint_state("/joint_states", ns + 1_000_000, joints, positions)
                messages += 1
            if step * 30 // 200 != (step - 1) * 30 // 200 or step == 0:  # 30 Hz
                shade = (xx + yy + step) % 256
                noise = rng.integers(0, 8, (HEIGHT, WIDTH, 1))
                image = np.concatenate(
                    [shade[..., None], (shade // 2)[..., None], noise * 16], axis=2
                )
                frame_ns = t0 + (step * 30 // 200) * 1_000_000_000 // 30
                bag.image("/camera/image_raw", frame_ns, (image + noise).astype(np.uint8))
                messages += 1
            if step % 600 == 0 and (path / f"{path.name}.mcap").stat().st_size > megabytes * 10**6:
                break
            step += 1
    return messages, step * 0.005


def mapping(folder: Path) -> Path:
    rp5 = get_robot("rp5")
    data = {
        "robot": "rp5",
        "reference": "/camera/image_raw",
        "every": 3,
        "max_age_s": 0.05,
        "state": {
            "topic": "/joint_states",
            "joints": {j.name: j.name for j in (*rp5.arm, *rp5.gripper)},
        },
        "cameras": {"scene": "/camera/image_raw"},
        "image_size": 64,
        "action": {"source": "next_state"},
        "extras": {"imu": {"topic": "/imu", "fields": ["linear_acceleration", "angular_velocity"]}},
        "episodes": {"gap_s": 1.0},
        "task": "touch the red cube",
    }
    path = folder / "mapping.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def read_only(bag: Path) -> float:
    """Seconds to read (and decompress) every message, decoding none."""
    from rosbags.rosbag2 import Reader

    start = time.perf_counter()
    with Reader(bag) as reader:
        for _ in reader.messages():
            pass
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a 100 MB bag")
    parser.add_argument("--mb", type=int, help="bag size, MB (default 1000; --quick 100)")
    args = parser.parse_args()
    megabytes = args.mb or (100 if args.quick else 1000)
    with tempfile.TemporaryDirectory(prefix="import-rosbag-") as tmp:
        folder = Path(tmp)
        bag = folder / "bag"
        start = time.perf_counter()
        messages, seconds = make_bag(bag, megabytes)
        made_s = time.perf_counter() - start
        size_gb = sum(p.stat().st_size for p in bag.iterdir()) / 1e9
        print(
            f"bag: {size_gb:.2f} GB, {messages:,} messages, {seconds:.0f} s recorded "
            f"({made_s:.0f} s to make)"
        )
        read_s = read_only(bag)
        print(f"read: {read_s:.1f} s ({size_gb / read_s * 60:.2f} GB/min)")
        out = folder / "dataset"
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "import", "rosbag", str(bag), "--mapping",
             str(mapping(folder)), "--out", str(out)],
            cwd=ROOT, capture_output=True, text=True,
        )  # fmt: skip
        import_s = time.perf_counter() - start
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
        peak_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
        print(done.stdout.strip().splitlines()[-1])
        rate = size_gb / import_s * 60
        print(f"import: {import_s:.1f} s ({rate:.2f} GB/min), peak memory {peak_mb:.0f} MB")
        print(
            f"bag_gb={size_gb:.3f} messages={messages} read_s={read_s:.2f} import_s={import_s:.2f} "
            f"import_gb_per_min={rate:.2f} vs_target={rate / TARGET_GB_PER_MIN:.1f} "
            f"import_over_read={import_s / read_s:.1f} peak_rss_mb={peak_mb:.0f}"
        )


if __name__ == "__main__":
    main()
