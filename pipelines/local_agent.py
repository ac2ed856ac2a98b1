"""A local edge agent: the device the demo deploys to, on 127.0.0.1.

Its files live under ``$ROBO_PIPE_HOME/edge/local-agent``: ``device.yaml``, the bearer token
(``token``, mode 0600), the agent's state (slots, journal, history) in ``state/`` and its log in
``agent.log``. The signing key pair is the home's default (``$ROBO_PIPE_HOME/keys/robo-pipe.*``),
made on first use. The agent runs only inside :func:`running_local_agent`, for one run of the
home at a time (:mod:`robo_pipe.locks`); between runs its state stays, so ``robo-pipe
edge-agent --config $ROBO_PIPE_HOME/edge/local-agent/device.yaml`` serves the last deployed
version again.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from deploy_edge.client import AgentClient, DeviceEntry, DeviceError
from pipelines.config import PipelineConfig
from pipelines.home import home_dir
from pipelines.release import default_key
from pipelines.services import free_port
from robo_pipe.locks import StatusFn, output_lock

NAME = "local-agent"
TOKEN_ENV = "ROBO_PIPE_LOCAL_AGENT_TOKEN"
START_TIMEOUT_S = 60.0


def agent_dir() -> Path:
    """``$ROBO_PIPE_HOME/edge/local-agent``."""
    folder = home_dir("edge") / NAME
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def signing_key() -> Path:
    """The home's signing key, generated (with its public key) on first use."""
    from deploy_edge.keys import generate_keypair

    key = default_key()
    with output_lock(key, "keys"):  # two first runs at once must not make two key pairs
        if not key.is_file():
            generate_keypair(key.parent, key.stem)
    return key


def _token() -> str:
    path = agent_dir() / "token"
    if not path.is_file():
        path.touch(mode=0o600)
        path.write_text(secrets.token_urlsafe(32))
    return path.read_text().strip()


def write_device_config(cfg: PipelineConfig, port: int) -> Path:
    """The local agent's ``device.yaml``: trusts the home's key, gates on ``cfg.latency``'s
    target, steps and pacing, listens on 127.0.0.1:``port``."""
    gate = cfg.latency
    device = {
        "name": NAME,
        "listen": f"127.0.0.1:{port}",
        "trusted_keys": [str(signing_key().with_suffix(".pub"))],
        "token_sha256": hashlib.sha256(_token().encode()).hexdigest(),
        "target": gate.target,
        "state_dir": "state",
        "gate_steps": gate.steps,
        "gate_warmup": gate.warmup,
        "pace": gate.pace,
        "health_ticks": 10,
    }
    path = agent_dir() / "device.yaml"
    path.write_text(yaml.safe_dump(device, sort_keys=False))
    return path


@contextmanager
def running_local_agent(
    cfg: PipelineConfig, on_status: StatusFn | None = None
) -> Iterator[DeviceEntry]:
    """Start the local agent, yield its devices-file entry (its token in this process's
    environment), and stop it on the way out, whatever happened.

    Runs sharing the home take turns with the agent (its state, token and device.yaml): this
    holds the agent folder's inter-process lock for the block; ``on_status`` is told when it
    waits for another run's deploy."""
    with output_lock(agent_dir(), "deploy", on_status):
        port = free_port()
        config = write_device_config(cfg, port)
        os.environ[TOKEN_ENV] = _token()
        entry = DeviceEntry(name=NAME, url=f"http://127.0.0.1:{port}", token_env=TOKEN_ENV)
        with (agent_dir() / "agent.log").open("a") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "deploy_edge.agent", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + START_TIMEOUT_S
            while True:
                if process.poll() is not None:
                    log_path = agent_dir() / "agent.log"
                    raise DeviceError(f"the local edge agent exited; see {log_path}")
                try:
                    with AgentClient(entry, timeout_s=2.0) as client:
                        client.health()
                    break
                except DeviceError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.2)
            yield entry
        finally:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
