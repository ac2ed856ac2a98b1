"""Deploying the default VLA to a local edge agent: release size, and the wall time of each step
(upload, then the agent's verify, extract, engine, parity, gate, activate, health, commit),
with the agent's memory idle and after the deployment.

A freshly initialised default VLA (the demo's size: the same graph and cost as a trained one)
is exported, signed into a release and deployed with the same client ``robo-pipe deploy``
uses to a real agent process (``python -m deploy_edge.agent``) on 127.0.0.1 with the
``local-cpu`` profile and the simulated rp5. The gate runs paced at the control rate, as on
the robot (``--quick``: 50 unpaced steps).

Run: ``python benchmarks/deploy.py [--quick]``; the last line is ``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from deploy_edge.client import AgentClient, DeviceEntry
from deploy_edge.keys import generate_keypair, load_private_key
from deploy_edge.release import file_sha256, write_release
from pipelines.config import CONFIG_DIR, load_config
from pipelines.services import free_port
from stages.export import export
from stages.policy.checkpoint import save_new_policy

TOKEN = "benchmark-token"


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="50 unpaced gate steps")
    args = parser.parse_args()
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        checkpoint = save_new_policy(
            cfg.policy, cfg.scene.cameras, cfg.scene.image_size, root / "ckpt"
        )
        bundle = Path(export(checkpoint, root / "export").path)
        private, public = generate_keypair(root / "keys", "bench")
        start = time.perf_counter()
        release = root / "policy.release"
        write_release(
            bundle,
            release,
            load_private_key(private),
            model_name="demo-policy",
            model_version="1",
            run_id="benchmark",
            release=1,
        )
        sign_s = time.perf_counter() - start
        size_mb = release.stat().st_size / 1e6
        port = free_port()
        device = {
            "name": "bench",
            "listen": f"127.0.0.1:{port}",
            "trusted_keys": [str(public)],
            "token_sha256": hashlib.sha256(TOKEN.encode()).hexdigest(),
            "state_dir": str(root / "state"),
            "gate_steps": 50 if args.quick else cfg.latency.steps,
            "gate_warmup": 5 if args.quick else cfg.latency.warmup,
            "pace": not args.quick,
            "health_ticks": 30,
        }
        (root / "device.yaml").write_text(yaml.safe_dump(device))
        agent = subprocess.Popen(
            [sys.executable, "-m", "deploy_edge.agent", "--config", str(root / "device.yaml")]
        )
        try:
            os.environ["BENCH_TOKEN"] = TOKEN
            entry = DeviceEntry(
                name="bench", url=f"http://127.0.0.1:{port}", token_env="BENCH_TOKEN"
            )
            client = AgentClient(entry)
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.health()
                    break
                except Exception:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            idle_mb = rss_mb(agent.pid)
            sha256 = file_sha256(release)
            start = time.perf_counter()
            client.upload(release, sha256)
            upload_s = time.perf_counter() - start
            start = time.perf_counter()
            record = client.deploy(sha256)
            deploy_s = time.perf_counter() - start
            after_mb = rss_mb(agent.pid)
        finally:
            agent.terminate()
            agent.wait(timeout=30)
    assert record["state"] == "active", record
    steps = {s["name"]: s["seconds"] for s in record["steps"]}
    print(f"release: {size_mb:.1f} MB, signed in {sign_s:.2f} s; upload {upload_s:.2f} s")
    for name, seconds in steps.items():
        print(f"  {name:<9} {seconds:7.2f} s")
    gate = record["gate"]
    print(
        f"on-device gate: p50 {gate['p50_ms']:.2f} ms, p99 {gate['p99_ms']:.2f} ms; agent memory "
        f"{idle_mb:.0f} MB idle, {after_mb:.0f} MB serving"
    )
    figures = {
        "release_mb": f"{size_mb:.2f}",
        "sign_s": f"{sign_s:.2f}",
        "upload_s": f"{upload_s:.2f}",
        **{f"{name}_s": f"{seconds:.2f}" for name, seconds in steps.items()},
        "deploy_s": f"{upload_s + deploy_s:.2f}",
        "p99_ms": f"{gate['p99_ms']:.2f}",
        "agent_idle_mb": f"{idle_mb:.0f}",
        "agent_serving_mb": f"{after_mb:.0f}",
    }
    print(" ".join(f"{k}={v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
