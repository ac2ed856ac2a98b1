"""Real edge-agent processes for benchmarks: started on 127.0.0.1 with a device file of their
own, and a client once one answers."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import yaml

from deploy_edge.client import AgentClient
from deploy_edge.device import DeviceEntry
from pipelines.services.local_servers import free_port

TOKEN = "benchmark-token"
"""The operate token every benchmark agent accepts (in ``BENCH_TOKEN`` for the client)."""


def start_agent(
    root: Path,
    name: str,
    public: Path,
    gate_steps: int,
    gate_warmup: int,
    pace: bool,
    health_ticks: int,
    target: Path | None = None,
) -> tuple[subprocess.Popen[bytes], DeviceEntry]:
    """A real agent process on 127.0.0.1 trusting ``public`` (``target``: a profile file; by
    default local-cpu), and its devices-file entry."""
    port = free_port()
    device = {
        **({"target": str(target)} if target else {}),
        "name": name,
        "listen": f"127.0.0.1:{port}",
        "trusted_keys": [str(public)],
        "tokens": {"operate": [hashlib.sha256(TOKEN.encode()).hexdigest()]},
        "state_dir": str(root / name / "state"),
        "gate_steps": gate_steps,
        "gate_warmup": gate_warmup,
        "pace": pace,
        "health_ticks": health_ticks,
    }
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "device.yaml").write_text(yaml.safe_dump(device))
    agent = subprocess.Popen(
        [sys.executable, "-m", "deploy_edge.agent", "--config", str(root / name / "device.yaml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    os.environ["BENCH_TOKEN"] = TOKEN
    return agent, DeviceEntry(name=name, url=f"http://127.0.0.1:{port}", token_env="BENCH_TOKEN")


def wait_healthy(entry: DeviceEntry, timeout_s: float = 120.0) -> AgentClient:
    """A client of the agent once it answers."""
    client = AgentClient(entry)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            client.health()
            return client
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def rss_mb(pid: int) -> float:
    """Resident memory of process ``pid`` in MB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")
