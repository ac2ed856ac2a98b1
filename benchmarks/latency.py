"""Whole-control-step latency of the default VLA at batch 1 on one CPU core: eager torch
against the exported ONNX model in ONNX Runtime, in the same run.

Both run inside the same control loop (``deploy_edge.runtime.ControlLoop``) on the simulated
robot, timing observation in -> action out (copies, tokenization, inference, post-processing)
for ``--steps`` back-to-back steps after warm-up; only the policy behind the loop differs.
Targets: exported p99 <= 20 ms and >= 1.5x faster than eager torch at p99.

Run: ``python benchmarks/latency.py [--steps N] [--checkpoint DIR]`` (default: a freshly
initialised default VLA -- the same graph and cost as a trained one).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch

from deploy_edge.exported import ExportedPolicy
from deploy_edge.runtime import ControlLoop
from pipelines.config import CONFIG_DIR, load_config
from robots.rp5 import RP5
from robots.spec import get_robot
from sim_scenes.batched_env import BatchedObservation
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import get_variant
from stages.export import export
from stages.policy.base import VLAPolicy
from stages.policy.checkpoint import load_policy, save_new_policy


class EagerPolicy:
    """The checkpoint in eager torch behind the loop's ``infer`` interface."""

    def __init__(self, policy: VLAPolicy) -> None:
        self.policy = policy.eval()
        self.chunk_len = policy.cfg.chunk_len

    def infer(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> np.ndarray:
        return self.policy.predict_chunk(BatchedObservation(images, state, instructions))


def measure(policy: EagerPolicy | ExportedPolicy, steps: int) -> np.ndarray:
    """Step latencies (ms) of ``steps`` back-to-back control steps after 50 warm-up steps."""
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    robot = SimulatedRobot(
        get_robot(cfg.robot), get_variant(cfg.scene.variant), cameras=("scene",), image_size=64
    )
    robot.connect()
    try:
        loop = ControlLoop(policy, robot, robot.instruction, pace=False)
        loop.run(50)
        return np.array([t.latency_s for t in loop.run(steps)]) * 1000.0
    finally:
        robot.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint
        if checkpoint is None:
            checkpoint = save_new_policy(
                cfg.policy, cfg.scene.cameras, cfg.scene.image_size, Path(tmp) / "fresh-vla"
            )
        exported = export(checkpoint, Path(tmp) / "export", RP5.control_hz)
        rows = {
            "torch eager": measure(EagerPolicy(load_policy(checkpoint)), args.steps),
            "ONNX Runtime": measure(ExportedPolicy(exported.path, threads=1), args.steps),
        }
    print(f"\nwhole control step, batch 1, 1 thread, {args.steps} steps (ms)")
    print(f"{'path':<14} {'p50':>7} {'p95':>7} {'p99':>7} {'max':>7}")
    for name, ms in rows.items():
        p50, p95, p99 = np.percentile(ms, [50, 95, 99])
        print(f"{name:<14} {p50:>7.2f} {p95:>7.2f} {p99:>7.2f} {ms.max():>7.2f}")
    eager99 = float(np.percentile(rows["torch eager"], 99))
    ort99 = float(np.percentile(rows["ONNX Runtime"], 99))
    print(f"parity |ORT - torch| {exported.parity_max_abs_error:.1e}")
    print(f"ort_p99_ms={ort99:.2f} eager_p99_ms={eager99:.2f} speedup_p99={eager99 / ort99:.2f}")


if __name__ == "__main__":
    main()
