"""Asynchronous chunk execution, measured: a policy slower than the control period, the cost of
inference delay on task success, and the edge agent serving several robots at once.

In one run:

- **A VLA at 250 M parameters on this CPU** (the ``smolvlm-256m`` preset, random weights: a
  systems measurement): exported through ``robo-pipe export`` with the chunk length the gate's
  arithmetic asks for (:func:`deploy_edge.async_loop.async_shortfall`: ``chunk_len >= 2 d``, ``d``
  the ticks of inference p99 + margin), its ONNX Runtime inference p50/p99 at one thread, then
  on the simulated rp5 at 10 Hz: the synchronous loop (every tick that infers overruns the
  period and misses; it is measured on ``--sync-ticks`` ticks, each one inference long, and
  scaled to 300) against the asynchronous loop over 300 paced ticks, with the linear seam
  blend and without it (``blend: none``): misses, action age p50/p99 (observation taken ->
  action sent) and the largest seam jump (rad, one tick to the next at a seam).
- **The cost of delay on success**: the default VLA (``--checkpoint``, a trained one whose
  chunk covers the delays; else a quick BC-trained one) played on the held-out suite with an
  inference delay of 0, 150 and 300 ms in simulation (``evaluate.delay``), synchronous and
  asynchronous, each compared with itself at zero delay on the same seeds through the paired
  test.
- **The policy server**: the default VLA's export deployed to a real local agent, and 4 robot
  clients (:class:`deploy_edge.policy_client.remote_policy.RemotePolicy` under
  :class:`deploy_edge.async_loop.AsyncControlLoop`, a simulated rp5 each) at 10 Hz at once:
  per-client misses and action age.

``--quick``: the default VLA size with an injected 250 ms delay at the engine seam in place of
the 250 M export, a small evaluation, 60 ticks per loop.

Run: ``python benchmarks/async_control.py [--quick] [--checkpoint DIR]``; the last line is
``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the repository root is not on the path

from benchmarks.vla_scale import export_in_subprocess, fresh_checkpoint, small_dataset  # noqa: E402
from deploy_edge.async_loop import AsyncControlLoop, async_shortfall, inference_ticks  # noqa: E402
from deploy_edge.exported import ExportedPolicy  # noqa: E402
from deploy_edge.runtime import ChunkPolicy, ControlLoop, Tick, measure_inference  # noqa: E402
from pipelines.config import CONFIG_DIR, load_config  # noqa: E402
from robo_pipe.errors import RoboPipeError  # noqa: E402
from sim_scenes.sim_robot import simulated_rp5  # noqa: E402

PERIOD_S = 0.1
"""rp5's control period (10 Hz)."""
MARGIN_S = 0.05
"""Added to inference p99: the queue's copy and scheduling on a loaded 2-core machine."""
INSTRUCTION = "touch the red cube"
PARTS = ("slow", "delay", "server")
"""What ``--parts`` may name (module docstring: the three measurements)."""


class DelayedPolicy:
    """A policy with ``delay_s`` added to every inference: the engine seam of ``--quick``."""

    def __init__(self, policy: ExportedPolicy, delay_s: float) -> None:
        self.policy, self.delay_s, self.chunk_len = policy, delay_s, policy.chunk_len

    def infer(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> np.ndarray:
        time.sleep(self.delay_s)
        return self.policy.infer(images, state, instructions)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small and fast (see the docstring)")
    parser.add_argument("--checkpoint", type=Path, help="a trained default VLA checkpoint")
    parser.add_argument("--chunk-len", type=int, default=40, help="chunk of the 250 M export")
    parser.add_argument("--sync-ticks", type=int, default=10, help="sync ticks measured at 250 M")
    parser.add_argument(
        "--parts",
        nargs="+",
        choices=PARTS,
        default=list(PARTS),
        help="which measurements (default: all): slow (the 250 M policy), delay, server",
    )
    args = parser.parse_args()
    ticks = 60 if args.quick else 300
    figures: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        dataset = small_dataset(root / "dataset")
        default_export = root / "default-export"
        checkpoint = args.checkpoint or fresh_checkpoint(
            load_config(CONFIG_DIR / "demo.yaml", ["policy.chunk_len=8"]), root / "default-ckpt"
        )
        if {"slow", "server"} & set(args.parts):
            export_in_subprocess(checkpoint, default_export, dataset, "demo.yaml", [])
        if "slow" in args.parts and args.quick:
            slow = DelayedPolicy(ExportedPolicy(default_export), 0.25)
            figures |= slow_policy("quick", slow, ticks, args.sync_ticks)
        elif "slow" in args.parts:
            figures |= slow_policy(
                "256m", export_256m(root, dataset, args.chunk_len), ticks, args.sync_ticks
            )
        if "delay" in args.parts:
            figures |= delay_success(checkpoint, root, 8 if args.quick else 100)
        if "server" in args.parts:
            figures |= policy_server(default_export, root, ticks, clients=4)
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


def export_256m(root: Path, dataset: Path, chunk_len: int) -> ExportedPolicy:
    """The ``smolvlm-256m`` preset with random weights and ``chunk_len`` actions, exported FP32
    (no INT8 variant: the FP32 graph is the one timed here), on ONNX Runtime at one thread."""
    overrides = [f"policy.chunk_len={chunk_len}", "export.variants=[]"]
    cfg = load_config(CONFIG_DIR / "vla-256m.yaml", overrides)
    checkpoint = fresh_checkpoint(cfg, root / "256m-ckpt")
    export_dir = root / "256m-export"
    export_in_subprocess(checkpoint, export_dir, dataset, "vla-256m.yaml", overrides)
    return ExportedPolicy(export_dir, threads=1)


def inference_seconds(
    policy: ChunkPolicy, cameras: tuple[str, ...], size: int, n: int
) -> list[float]:
    """``n`` back-to-back inferences on a simulated rp5's observation, after one warm-up (s)."""
    robot = simulated_rp5(cameras, size)
    robot.connect()
    try:
        return list(measure_inference(policy, robot, INSTRUCTION, n))
    finally:
        robot.stop()


def _shape(policy: ChunkPolicy) -> tuple[tuple[str, ...], int]:
    inner = policy.policy if isinstance(policy, DelayedPolicy) else policy
    assert isinstance(inner, ExportedPolicy)
    return tuple(inner.cameras), inner.image_size


def run_loop(loop: ControlLoop | AsyncControlLoop, ticks: int) -> list[Tick]:
    """``ticks`` paced ticks of ``loop`` on its (connected) robot."""
    loop.robot.connect()
    try:
        with loop:
            return loop.run(ticks)
    finally:
        loop.robot.stop()


def loop_figures(records: list[Tick], label: str) -> dict[str, str]:
    """Misses, action age p50/p99 (ms) and the largest seam jump of one loop's ticks."""
    ages = [t.action_age_s * 1000 for t in records if t.action_age_s is not None]
    jumps = [t.seam_jump for t in records if t.seam_jump is not None]
    out = {f"{label}_misses": str(sum(t.missed for t in records))}
    if ages:
        out[f"{label}_age_p50_ms"] = f"{np.percentile(ages, 50):.0f}"
        out[f"{label}_age_p99_ms"] = f"{np.percentile(ages, 99):.0f}"
    if jumps:
        out[f"{label}_seam_jump_max"] = f"{max(jumps):.4f}"
    return out


def slow_policy(label: str, policy: ChunkPolicy, ticks: int, sync_ticks: int) -> dict[str, str]:
    """Sync against async (blended and not) at 10 Hz for a policy slower than the period."""
    cameras, size = _shape(policy)
    seconds = inference_seconds(policy, cameras, size, 5 if label == "quick" else 10)
    p50, p99 = float(np.percentile(seconds, 50)), float(np.percentile(seconds, 99))
    d = inference_ticks(p99, MARGIN_S, PERIOD_S)
    print(
        f"{label}: inference p50 {p50 * 1000:.0f} ms, p99 {p99 * 1000:.0f} ms at 1 thread: "
        f"d = {d} ticks, the gate's arithmetic asks for a chunk >= {2 * d} (it has "
        f"{policy.chunk_len})",
        flush=True,
    )
    figures = {
        f"{label}_inference_p50_ms": f"{p50 * 1000:.0f}",
        f"{label}_inference_p99_ms": f"{p99 * 1000:.0f}",
        f"{label}_chunk_len": str(policy.chunk_len),
        f"{label}_chunk_needed": str(2 * d),
    }
    shortfall = async_shortfall(policy.chunk_len, PERIOD_S, p99, MARGIN_S)
    if shortfall:
        print(f"  refused: {shortfall} (rerun with --chunk-len {2 * d + d})", flush=True)
        return figures | {f"{label}_refused": "1"}
    # Sync: the whole chunk executed per inference (its best case); every tick that infers
    # overruns 100 ms, misses and drops the queue, so the next tick infers again.
    sync = ControlLoop(policy, simulated_rp5(cameras, size), INSTRUCTION, execute=policy.chunk_len)
    measured = run_loop(sync, sync_ticks)
    sync_misses = sum(t.missed for t in measured) * ticks / sync_ticks
    print(f"  sync: {sum(t.missed for t in measured)} of {sync_ticks} ticks missed", flush=True)
    figures[f"{label}_sync_misses_per_{ticks}"] = f"{sync_misses:.0f}"
    for blend in ("linear", "none"):
        loop = AsyncControlLoop(
            policy,
            simulated_rp5(cameras, size),
            INSTRUCTION,
            inference_s=p99,
            margin_s=MARGIN_S,
            blend=blend,
        )
        records = run_loop(loop, ticks)
        got = loop_figures(records, f"{label}_async_{blend}")
        print(f"  async, blend {blend}: {got}", flush=True)
        figures |= got
    return figures


def delay_success(checkpoint: Path, root: Path, episodes: int) -> dict[str, str]:
    """Held-out success of ``checkpoint`` with 150 and 300 ms of inference in simulation, sync
    and async, each against the same policy at zero delay on the same seeds (paired test over
    every seed: no early stop)."""
    from stages.evaluate import evaluate
    from stages.evaluate.config import DelayConfig, SequentialConfig

    cfg = load_config(CONFIG_DIR / "demo.yaml", [f"evaluate.episodes={episodes}"])
    ev = cfg.evaluate.model_copy(update={"sequential": SequentialConfig(enabled=False)})
    args = (cfg.robot, cfg.scene, cfg.sim)
    zero = evaluate(checkpoint, *args, ev, cfg.seed, root / "eval-0ms")
    print(f"delay 0 ms: success {zero.success_rate:.1%} on {zero.episodes} episodes", flush=True)
    figures = {
        "delay_episodes": str(zero.episodes),
        "delay_0ms_success": f"{zero.success_rate:.3f}",
    }
    for ms in (150.0, 300.0):
        for mode in ("sync", "async"):
            delayed = ev.model_copy(update={"delay": DelayConfig(mode=mode, inference_ms=ms)})
            try:
                report = evaluate(
                    checkpoint,
                    *args,
                    delayed,
                    cfg.seed,
                    root / f"eval-{mode}-{ms:g}",
                    baseline_outcomes=zero.successes_by_episode(),
                    margin=cfg.registry.promotion.margin,
                )
            except RoboPipeError as err:  # an async chunk that cannot cover the delay
                print(f"delay {ms:g} ms {mode}: refused: {err}", flush=True)
                figures[f"delay_{mode}_{ms:.0f}ms_refused"] = "1"
                continue
            c = report.comparison
            assert c is not None
            print(
                f"delay {ms:g} ms {mode}: success {report.success_rate:.1%} "
                f"(zero delay {c.baseline_success_rate:.1%}, difference {c.difference:+.1%}, "
                f"95% CI {c.difference_ci95[0]:+.1%} .. {c.difference_ci95[1]:+.1%}, "
                f"p {c.p_value:.3g}: {c.decision})",
                flush=True,
            )
            key = f"delay_{mode}_{ms:.0f}ms"
            figures |= {
                f"{key}_success": f"{report.success_rate:.3f}",
                f"{key}_p": f"{c.p_value:.3g}",
                f"{key}_passed": str(int(c.passed)),
            }
    return figures


def policy_server(export_dir: Path, root: Path, ticks: int, clients: int) -> dict[str, str]:
    """``clients`` robots at 10 Hz against one local agent serving ``export_dir``."""
    from benchmarks.local_agents import TOKEN, start_agent, wait_healthy
    from deploy_edge.keys import generate_keypair, load_private_key
    from deploy_edge.policy_client.remote_policy import RemotePolicy
    from deploy_edge.release.signature import write_release
    from robo_pipe.integrity import file_sha256

    private, public = generate_keypair(root / "server-keys", "bench")
    release = root / "server.release"
    write_release(
        export_dir,
        release,
        load_private_key(private),
        model_name="async-bench-policy",
        model_version="1",
        run_id="benchmark",
        release=1,
    )
    agent, entry = start_agent(root / "agents", "policy-server", public, 20, 2, False, 5)
    results: dict[int, list[Tick]] = {}
    errors: list[str] = []
    try:
        client = wait_healthy(entry)
        sha256 = file_sha256(release)
        client.upload(release, sha256)
        record = client.deploy(sha256)
        assert record.state == "active", record
        url = entry.url.replace("http://", "ws://")
        first = RemotePolicy(url, TOKEN)
        cameras, size = tuple(first.info.cameras), first.info.image_size
        seconds = inference_seconds(first, cameras, size, 20)
        p99 = float(np.percentile(seconds, 99))

        def robot(i: int) -> None:
            try:
                remote = RemotePolicy(url, TOKEN)
                loop = AsyncControlLoop(
                    remote,
                    simulated_rp5(cameras, size),
                    INSTRUCTION,
                    inference_s=p99,
                    margin_s=MARGIN_S,
                )
                results[i] = run_loop(loop, ticks)
            except Exception as err:  # reported below, never hidden
                errors.append(f"client {i}: {type(err).__name__}: {err}")

        threads = [threading.Thread(target=robot, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        agent.terminate()
        agent.wait(timeout=60)
    if errors:
        raise SystemExit("\n".join(errors))
    figures = {"server_round_trip_p99_ms": f"{p99 * 1000:.1f}", "server_clients": str(clients)}
    for i, records in sorted(results.items()):
        got = loop_figures(records, f"server_client{i}")
        print(f"  policy server, client {i}: {got}", flush=True)
        figures |= got
    return figures


if __name__ == "__main__":
    main()
