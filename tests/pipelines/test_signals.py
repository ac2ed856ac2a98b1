"""SIGTERM stops every long-running verb, however it was started, and ``ui`` capturing the
runs of its home is said by both sides.

A script's ``robo-pipe ui &`` starts it with SIGINT ignored (a non-interactive shell does that
to background jobs), and Python then installs no ``KeyboardInterrupt`` for SIGINT. The verbs
are started that way here, through the CLI, and must still stop on SIGTERM with exit code 143
(128 + 15), leaving no process of their home behind; Ctrl-C (SIGINT, not ignored) exits 130.
"""

from __future__ import annotations

import hashlib
import json
import re
import signal
import socket
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from pipelines.services.local_servers import free_port
from tests.pipelines.test_flow import CONFIG
from tests.pipelines.test_serve import SETS, Cli, _kill_all, _port_free

NIGHTLY = "schedules=[{name: nightly, flow: train_simulate_deploy, cron: '0 2 * * *'}]"
"""A schedule that runs nothing while a test serves it."""

STOP_BOUND_S = 30
"""How long a verb may take from SIGTERM to exit: a bound on hanging, not a speed figure
(ui and serve took 2-4 s on two shared cores)."""


def start_as_background_job(args: list[str], home: Path) -> Cli:
    """``robo-pipe ARGS`` in ``home``, started as a script's ``robo-pipe ARGS &`` starts it:
    with SIGINT ignored (a child inherits an ignored signal through fork and exec)."""
    cli = Cli(args, home, sigint_ignored=True)
    status = Path(f"/proc/{cli.proc.pid}/status").read_text()
    ignored = int(re.search(r"SigIgn:\s*([0-9a-f]+)", status)[1], 16)  # type: ignore[index]
    assert ignored & 1 << (signal.SIGINT - 1), "the verb starts with SIGINT ignored"
    return cli


def wait_for(what: str, check: object, cli: Cli, timeout_s: float = 180) -> None:
    """Wait until ``check()`` is true; fail (stopping ``cli``) if it exits or time runs out."""
    assert callable(check)
    deadline = time.monotonic() + timeout_s
    while not check():
        assert cli.alive(), f"exited before {what}: {cli.output()[-3000:]}"
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}: {cli.stop()[-3000:]}")
        time.sleep(0.3)


def stop(cli: Cli) -> tuple[str, float]:
    """SIGTERM ``cli``; its output and the seconds it took to exit."""
    start = time.monotonic()
    output = cli.stop()
    return output, time.monotonic() - start


def runner_polling(api: str) -> bool:
    """Every deployment on the Prefect server at ``api`` is served: a runner polled it."""
    request = urllib.request.Request(
        f"{api}/deployments/filter", data=b"{}", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        deployments = json.load(response)
    return bool(deployments) and all(d["status"] == "READY" for d in deployments)


@pytest.mark.parametrize("when", ["servers-starting", "runner-serving"])
def test_serve_started_with_sigint_ignored_stops_on_sigterm_and_leaves_nothing(
    when: str, home_path: Path
) -> None:
    serve = start_as_background_job(
        ["serve", "--config", CONFIG, *SETS, "--set", NIGHTLY], home_path
    )
    state_file = home_path / "services.json"
    if when == "servers-starting":  # robo-pipe's own handler stops it
        log = home_path / "mlflow" / "server.log"  # opened just before the MLflow server starts
        wait_for("the servers starting", log.is_file, serve, timeout_s=60)
        time.sleep(2)
        assert not state_file.exists(), "the servers were meant to be starting"
        ports: list[int] = []
    else:  # Prefect's runner has installed a SIGTERM handler of its own
        wait_for("serve's own servers", state_file.is_file, serve)
        servers = json.loads(state_file.read_text())
        wait_for("the runner", lambda: runner_polling(servers["prefect_api_url"]), serve)
        ports = [int(servers[ui].rsplit(":", 1)[1]) for ui in ("prefect_ui", "mlflow_ui")]

    output, stopped_in = stop(serve)

    left = _kill_all(home_path)
    assert serve.proc.returncode == 143, output[-3000:]
    assert stopped_in < STOP_BOUND_S, f"serve took {stopped_in:.1f} s to stop"
    assert "stopped after" in output
    assert not left, "every process serve started has ended"
    assert all(_port_free(port) for port in ports), f"a server still holds one of {ports}"
    assert not state_file.exists()


def test_ui_announces_capture_run_and_serve_name_its_servers_and_all_stop_on_sigterm(
    home_path: Path,
) -> None:
    ui = start_as_background_job(["ui"], home_path)
    try:
        state_file = home_path / "services.json"
        wait_for("ui's servers", state_file.is_file, ui)
        servers = json.loads(state_file.read_text())
        wait_for("ui's announcement", lambda: "report to these servers" in ui.output(), ui)
        assert f"robo-pipe run and serve on this home ({home_path})" in ui.output()
        # MLflow's page in its model-training view: a fresh browser would open the GenAI one.
        training_view = f"{servers['mlflow_ui']}/#/experiments?workflowType=machine_learning"
        assert f"MLflow UI   {training_view}" in ui.output()
        said = (
            f"using the servers of robo-pipe ui (pid {ui.proc.pid}) on this home: Prefect UI "
            f"{servers['prefect_ui']}, MLflow UI {servers['mlflow_ui']}"
        )

        # run: says whose servers it uses; SIGTERM after its first stage exits 143, keeps that
        # stage (a rerun reuses it: test_serve's resumed fixture) and releases the run's lock.
        run = start_as_background_job(["run", "--config", CONFIG, *SETS], home_path)
        wait_for("run's first stage", lambda: any((home_path / "stages").glob("collect-*")), run)
        output, stopped_in = stop(run)
        assert run.proc.returncode == 143, output[-3000:]
        assert stopped_in < STOP_BOUND_S, f"run took {stopped_in:.1f} s to stop"
        assert said in output, output[-3000:]
        assert any((home_path / "stages").glob("collect-*.json")), "the completed stage is kept"
        assert not list((home_path / "runs" / ".active").iterdir()), "run released its lock"
        assert ui.alive(), "stopping run left ui's servers alone"

        # serve: says whose servers it uses; SIGTERM stops it, not ui's servers.
        serve = start_as_background_job(
            ["serve", "--config", CONFIG, *SETS, "--set", NIGHTLY], home_path
        )
        wait_for("the runner", lambda: runner_polling(servers["prefect_api_url"]), serve)
        output, stopped_in = stop(serve)
        assert serve.proc.returncode == 143, output[-3000:]
        assert said in output, output[-3000:]
        assert ui.alive() and state_file.is_file(), "stopping serve left ui's servers alone"

        # A run attached to the ui when the ui stops, in a fine-tuning long enough (~1 min) to be
        # stopped in: one line naming the ui, exit 3, its completed stages kept.
        longer = ["--set", "finetune.bc.steps=3000"]
        attached = start_as_background_job(["run", "--config", CONFIG, *SETS, *longer], home_path)
        pretrained = re.compile(r"^pretrain: (ok|reused)", re.MULTILINE)
        wait_for(
            "the attached run's fine-tuning", lambda: pretrained.search(attached.output()), attached
        )
        output, stopped_in = stop(ui)
        assert ui.proc.returncode == 143, output[-3000:]
        assert stopped_in < STOP_BOUND_S, f"ui took {stopped_in:.1f} s to stop"
        ports = [int(servers[url].rsplit(":", 1)[1]) for url in ("prefect_ui", "mlflow_ui")]
        assert all(_port_free(port) for port in ports), f"a server still holds one of {ports}"
        assert not state_file.exists()
        run_gone = time.monotonic()
        attached.proc.wait(timeout=90)
        output = attached.output()
        assert attached.proc.returncode == 3, output[-3000:]
        api = servers["prefect_api_url"]
        said_gone = f"the Prefect server at {api} (the servers of robo-pipe ui "
        assert said_gone in output, output[-3000:]
        assert "stopped answering: run stops" in output
        print(f"the attached run stopped {time.monotonic() - run_gone:.1f} s after the ui")
        assert any((home_path / "stages").glob("collect-*.json")), "its completed stages are kept"
        assert not _kill_all(home_path), "nothing of the run is left"
    finally:  # a failed assertion must not leave ui (or a run) holding its ports
        _kill_all(home_path)


@pytest.mark.parametrize(
    ("sigint_ignored", "signum", "code"),
    [(True, signal.SIGTERM, 143), (False, signal.SIGINT, 130)],
    ids=["sigterm-with-sigint-ignored", "ctrl-c"],
)
def test_edge_agent_stops_on_a_signal_with_its_exit_code(
    sigint_ignored: bool, signum: int, code: int, home_path: Path, tmp_path: Path
) -> None:
    port = free_port()
    device = {
        "name": "dev-arm-01",
        "listen": f"127.0.0.1:{port}",
        "tokens": {"operate": [hashlib.sha256(b"token").hexdigest()]},
        "state_dir": str(tmp_path / "agent-state"),
    }
    config = tmp_path / "device.yaml"
    config.write_text(yaml.safe_dump(device))
    args = ["edge-agent", "--device-config", str(config)]
    agent = start_as_background_job(args, home_path) if sigint_ignored else Cli(args, home_path)

    def listening() -> bool:
        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", port)) == 0

    wait_for("the agent", listening, agent, timeout_s=60)
    start = time.monotonic()
    agent.proc.send_signal(signum)
    try:
        agent.proc.wait(timeout=STOP_BOUND_S)
    finally:
        left = _kill_all(home_path)
    assert agent.proc.returncode == code, agent.output()[-3000:]
    assert time.monotonic() - start < STOP_BOUND_S
    assert not left and _port_free(port)


FINALIZER_STOP = """
import gc, os, signal, sys, time
from pipelines.services import signals
from pipelines.services.signals import Stopped, stop_on_sigterm

stop_on_sigterm()


class Dying:
    def __init__(self):
        self.cycle = self  # freed by a garbage collection, as a weakref callback is

    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)
        for _ in range(100_000):  # the handler runs here, inside the finalizer
            pass


try:
    Dying()
    gc.collect()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # a run's work after the collection
        pass
except Stopped as stopped:
    print("stopped", stopped.signum, "handled", len(signals._received))
    sys.exit(143)
print("ran on")
"""


def test_a_stop_that_lands_in_a_finalizer_still_stops_the_process() -> None:
    """SIGTERM's :class:`Stopped` raised while a finalizer runs cannot leave it (Python prints
    "Exception ignored in" and goes on): it is delivered again, and the process stops where it
    is next interruptible instead of running on to its end (a ``run`` once finished a whole
    pipeline after a SIGTERM that landed in a weakref callback)."""
    import subprocess
    import sys

    from tests.pipelines.test_serve import ROOT

    done = subprocess.run(
        [sys.executable, "-c", FINALIZER_STOP], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    # handled twice: first inside the finalizer (swallowed there), then where it stopped
    assert done.returncode == 143 and done.stdout.strip() == "stopped 15 handled 2", done
    assert "Exception ignored" not in done.stderr, done.stderr
