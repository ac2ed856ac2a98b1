"""How fast does collection run, how does it scale over Ray workers, and where does time go?

Collects the same episodes (scripted expert, touch-mixed, one 64x64 camera) three ways -- in
the calling process, with 1 Ray worker and with 2 -- each into a fresh dataset, and prints
frames/s, the 2-vs-1 worker scaling ratio, bytes on disk per frame, and the share of worker
time spent simulating, rendering, in the expert, encoding video and writing parquet. Ray's
start-up is done before timing; actor start-up (scene build, GL context) is included.

Run: ``python benchmarks/collect_throughput.py [--quick] [--episodes N]``.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from pipelines.config import CONFIG_DIR, load_config
from stages.collect import ShardResult, collect
from stages.dataset.layout import v3_files
from stages.ray_runtime import init_ray

PHASES = ("simulate", "render", "source", "encode", "write")


def run(workers: int, episodes: int, out: Path) -> tuple[float, int, int, dict[str, float]]:
    """Collect; return (wall s, frames, bytes of v3 files, seconds per phase)."""
    cfg = load_config(
        CONFIG_DIR / "demo.yaml",
        [
            f"collect.workers={workers}",
            f"collect.episodes={episodes}",
            "collect.episodes_per_shard=50",
        ],
    )
    phases = dict.fromkeys(PHASES, 0.0)

    def tally(result: ShardResult) -> None:
        for k in PHASES:
            phases[k] += result.timings.get(k, 0.0)

    start = time.perf_counter()
    ref = collect(cfg.robot, cfg.scene, cfg.sim, cfg.collect, cfg.seed, out, on_shard=tally)
    wall = time.perf_counter() - start
    size = sum(p.stat().st_size for p in v3_files(out))
    return wall, ref.frames, size, phases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="200 episodes instead of 600")
    parser.add_argument("--episodes", type=int, default=600)
    args = parser.parse_args()
    episodes = 200 if args.quick else args.episodes
    init_ray(None)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (0, 1, 2):
            rows[workers] = run(workers, episodes, Path(tmp) / f"w{workers}")
    print(f"{episodes} episodes, scripted expert, 1 camera 64x64, 16 envs per worker")
    print(
        f"{'mode':<14} {'wall s':>7} {'frames':>7} {'frames/s':>9} {'B/frame':>8}  "
        + " ".join(f"{p:>8}" for p in PHASES)
    )
    for workers, (wall, frames, size, phases) in rows.items():
        total = sum(phases.values()) or 1.0
        mode = "in-process" if workers == 0 else f"ray x{workers}"
        shares = " ".join(f"{phases[p] / total:>8.0%}" for p in PHASES)
        print(
            f"{mode:<14} {wall:>7.1f} {frames:>7} {frames / wall:>9,.0f} "
            f"{size / frames:>8,.0f}  {shares}"
        )
    fps1 = rows[1][1] / rows[1][0]
    fps2 = rows[2][1] / rows[2][0]
    print(
        f"frames_per_s_1={fps1:.0f} frames_per_s_2={fps2:.0f} scaling_2_vs_1={fps2 / fps1:.2f} "
        f"bytes_per_frame={rows[2][2] / rows[2][1]:.0f}"
    )


if __name__ == "__main__":
    main()
