"""A local edge agent: the device the demo deploys to, on 127.0.0.1, and the pipeline's deploy
stage onto it (:func:`deploy_to_local_agent`).

Its files live under ``$ROBO_PIPE_HOME/edge/local-agent``: ``device.yaml``, the bearer token
(``token``, mode 0600), the agent's state (slots, journal, history) in ``state/`` and its log in
``agent.log``; ``$ROBO_PIPE_HOME/edge/devices.yaml`` names it (``local-agent``, its URL and
token variable :data:`TOKEN_ENV`) for ``robo-pipe deploy --device``, ``robo-pipe devices`` and,
as a fleet file, ``robo-pipe fleet status --fleet`` (:func:`devices_file`). The signing key
pair is the home's default (``$ROBO_PIPE_HOME/keys/robo-pipe.*``,
:func:`pipelines.deploy.release.signing_key`), made on first use. The agent runs only inside
:func:`running_local_agent`, for one run of the home at a time (:mod:`robo_pipe.locks`), on
the port it had before when that is free; between runs its state stays, so ``robo-pipe
edge-agent --device-config $ROBO_PIPE_HOME/edge/local-agent/device.yaml`` serves the last
deployed version again, where the devices file says.
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

from deploy_edge.device import DeviceEntry, DeviceError, connect
from pipelines.config import PipelineConfig
from pipelines.deploy.release import (
    RegisteredVersion,
    already_running,
    bundle_release,
    deploy_release,
    device_tags,
    mark_replaced,
    signing_key,
    utc_stamp,
    variant_tags,
)
from pipelines.home import home_dir, home_path
from pipelines.progress import SILENT, Listener, status_lines
from pipelines.records import EdgeDeployment
from pipelines.registry.versions import set_version_tags
from pipelines.services.local_servers import free_port, port_free
from pipelines.services.processes import with_parent_death
from robo_pipe.locks import StatusFn, output_lock
from sim_scenes.tasks import resolve_task

NAME = "local-agent"
TOKEN_ENV = "ROBO_PIPE_LOCAL_AGENT_TOKEN"
START_TIMEOUT_S = 60.0


def agent_dir() -> Path:
    """``$ROBO_PIPE_HOME/edge/local-agent``."""
    folder = home_dir("edge") / NAME
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def devices_file() -> Path:
    """``$ROBO_PIPE_HOME/edge/devices.yaml``: the devices file (a fleet file too) that names the
    local agent, written when the agent starts (it may not exist yet; nothing is created)."""
    return home_path("edge") / "devices.yaml"


def _port() -> int:
    """The port the local agent listened on last time when it is free again (the devices file
    stays right), else a free one."""
    try:
        listen = yaml.safe_load((agent_dir() / "device.yaml").read_text())["listen"]
        port = int(str(listen).rpartition(":")[2])
    except (OSError, yaml.YAMLError, KeyError, TypeError, ValueError):
        return free_port()
    return port if port_free(port) else free_port()


def write_devices_file(cfg: PipelineConfig, entry: DeviceEntry) -> Path:
    """:func:`devices_file` naming ``entry`` (the local agent) on ``cfg``'s latency target."""
    device = {"name": entry.name, "url": entry.url, "token_env": entry.token_env}
    text = (
        "# The demo's local edge agent, written by robo-pipe run (rewritten each run). In this\n"
        "# home: start it with robo-pipe edge-agent --device-config edge/local-agent/device.yaml;\n"
        f"# its token: export {TOKEN_ENV}=$(cat edge/local-agent/token)\n"
    )
    listed = {"devices": [{**device, "target": cfg.latency.target}]}
    path = devices_file()
    path.write_text(text + yaml.safe_dump(listed, sort_keys=False))
    return path


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
        # Relative to this file (the agent resolves it so): the home can move.
        "trusted_keys": [os.path.relpath(signing_key().with_suffix(".pub"), agent_dir())],
        # The demo's one token does everything a user of the demo does: operate.
        "tokens": {"operate": [hashlib.sha256(_token().encode()).hexdigest()]},
        "target": gate.target,
        "state_dir": "state",
        "gate_steps": gate.steps,
        "gate_warmup": gate.warmup,
        "pace": gate.pace,
        "health_ticks": 10,
        # The simulated robot on the task the run learnt, its gate given the family's example.
        "driver": "sim_scenes.sim_robot:simulated",
        "driver_args": {"task": cfg.scene.variant},
        "instruction": resolve_task(cfg.scene.variant)[0].example_instruction,
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
        port = _port()
        config = write_device_config(cfg, port)
        os.environ[TOKEN_ENV] = _token()
        entry = DeviceEntry(name=NAME, url=f"http://127.0.0.1:{port}", token_env=TOKEN_ENV)
        write_devices_file(cfg, entry)
        with (agent_dir() / "agent.log").open("a") as log:
            process = subprocess.Popen(  # it ends with this process, however that dies
                with_parent_death(
                    [sys.executable, "-m", "deploy_edge.agent", "--config", str(config)]
                ),
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
                    with connect(entry, timeout_s=2.0) as device:
                        device.health()
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


def deploy_to_local_agent(
    cfg: PipelineConfig, registration: RegisteredVersion, listener: Listener = SILENT
) -> EdgeDeployment:
    """The pipeline's deploy stage: ``registration``'s version, signed with the home's key,
    onto the local edge agent, then one episode on it. A device that already runs this
    release keeps it (a re-run of the demo changes nothing there). A random-weights policy
    (systems measurements only) is never deployed by the pipeline: the stage says so and
    deploys nothing (``robo-pipe deploy --systems-test`` does, when asked)."""
    from robo_pipe.integrity import file_sha256

    # The stage's own start: a display times it from here (its device steps report their own).
    listener.started("deploy", None, f"to {NAME}")
    manifest, path = bundle_release(registration, signing_key())
    if manifest.io_spec.random_weights:
        reason = (
            "random weights (systems measurements only): the pipeline never deploys such a "
            "policy; a systems test does it with robo-pipe deploy --systems-test"
        )
        listener.finished("deploy", f"skipped: {reason}", reused=False)
        return EdgeDeployment(
            device=NAME,
            model_version=registration.version,
            state="refused",
            reason=reason,
            p99_ms=None,
            episode_success=None,
            episode_ticks=0,
            episode_p99_ms=None,
            state_dir=str(agent_dir() / "state"),
        )
    # Runs sharing the home take turns with the agent: a second deploy waits, and says so.
    with running_local_agent(cfg, status_lines("deploy", listener)) as entry:
        with connect(entry) as device:
            active = device.status().active
            running = already_running(device, manifest, file_sha256(path))
        if running is not None:  # already there: report the gate it passed
            state, reason, gate = "active", "already runs this release", running.gate
            variant = variant_tags(entry.name, running)
            listener.finished("verify", "already runs this release", reused=True)
        else:
            done, _ = deploy_release(entry, path, listener=listener)
            state, reason, gate = done.state, done.reason, done.gate
            variant = variant_tags(entry.name, done) if state == "active" else {}
        episode = None
        if state == "active":
            listener.started("episode", cfg.deploy.episode_ticks, "ticks")
            with connect(entry) as device:
                episode = device.episode(None, cfg.deploy.episode_ticks)  # the scene's task
            success = {True: "success", False: "no success", None: "done"}[episode.success]
            detail = f"{success} in {episode.ticks} ticks, p99 {episode.p99_ms:.2f} ms"
            listener.finished("episode", detail, reused=False)
    # Where the version runs, on the version itself (as a fleet rollout records it).
    before = active.label if active is not None else "none"
    runs = f"{registration.name}:{registration.version}" if state == "active" else before
    at, p99 = utc_stamp(), f"{gate.p99_ms:.2f}" if gate else "-"
    tags = device_tags(entry.name, version=runs, state=state, at=at, p99_ms=p99) | variant
    set_version_tags(registration.name, registration.version, tags)
    if active is not None and before != runs:  # the version it left no longer runs there
        problem = mark_replaced(entry.name, before, runs, at)
        if problem:
            listener.said("deploy", problem)
    return EdgeDeployment(
        device=entry.name,
        model_version=registration.version,
        state=state,
        reason=reason,
        p99_ms=gate.p99_ms if gate else None,
        episode_success=episode.success if episode else None,
        episode_ticks=episode.ticks if episode else 0,
        episode_p99_ms=episode.p99_ms if episode else None,
        state_dir=str(agent_dir() / "state"),
    )
