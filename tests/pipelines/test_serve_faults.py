"""Faults under ``robo-pipe serve``: its Prefect server killed, a signal with the server gone,
``serve`` itself killed, and the ``ui`` it attached to stopped.

Through the CLI in subprocesses, each test on its own home with a schedule that runs nothing
(or a 5-second champion check where a run must happen). The rules (docs/pipeline.md,
"Stopping and faults"):

- a Prefect server that dies under ``serve`` is said in one line and started again on the same
  port by the ``serve`` that owns it, and serving goes on; no traceback;
- SIGINT to ``serve``'s process group (a terminal's Ctrl-C) and SIGTERM each stop it within
  :data:`STOP_BOUND_S` even with its server gone;
- the servers of a ``serve`` killed with SIGKILL exit by themselves within seconds (parent-death
  signal), and one that survived anyway is found, reported and stopped by the next start;
- ``serve`` on the servers of a ``ui`` that stops says so in one line and exits 3.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pipelines.serve.deployments import STOP_BOUND_S as RUNNER_BOUND_S
from tests.pace import bound_s
from tests.pipelines.test_flow import CONFIG
from tests.pipelines.test_serve import SETS, Cli, _kill_all, _port_free, home_processes
from tests.pipelines.test_signals import NIGHTLY, runner_polling, wait_for

STOP_BOUND_S = RUNNER_BOUND_S + 5
"""From the signal to serve's exit: the runner's bound plus stopping its own servers (5 s grace
before SIGKILL). docs/pipeline.md states it. Asserted as :func:`tests.pace.bound_s` of it: plus
:data:`EXIT_STARTS` CLI start-ups at the machine's pace measured in the test, so that the bound
holds on cores a second heavy job shares."""

EXIT_STARTS = 5
"""What a stopping ``serve`` does besides waiting for its bound (ending its threads, its
servers' processes and its own interpreter), counted in CLI start-ups: ~5 s on a quiet
machine."""

CHECK = "schedules=[{name: check, flow: champion_regression, interval_s: 5}]"
"""A run every 5 s (it fails at once: the home has no champion; it ran, which is the point)."""


def pids_alive(pids: list[int]) -> list[int]:
    """Those of ``pids`` still running (not zombies)."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def traceback_free(output: str) -> None:
    """Serve printed no traceback. A flow run whose process was starting when the server died
    crashes, and its engine prints that traceback once under a log line (``prefect.engine -
    Execution of flow run ... exited with unexpected exception``): the run's output, relayed,
    is left out."""
    own, in_run = [], False
    for line in output.splitlines():
        if re.match(r"\d\d:\d\d:\d\d\.\d+ \| ", line):
            in_run = "prefect.engine - Execution of flow run" in line
        if not in_run:
            own.append(line)
    kept = "\n".join(own)
    assert "Traceback" not in kept and "ConnectError" not in kept, kept[-3000:]


@pytest.fixture
def started() -> Iterator[list[Cli]]:
    """The verbs a test starts; whatever is left of their homes is killed at the end."""
    clis: list[Cli] = []
    yield clis
    for cli in clis:
        if cli.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cli.proc.pid, signal.SIGKILL)
        _kill_all(cli.home)


def servers_of(cli: Cli) -> Any:
    """``services.json`` once ``cli`` wrote it (one left by a killed verb is not its own)."""
    state_file = cli.home / "services.json"

    def written() -> Any:
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(state_file.read_text())
            return state if state["pid"] == cli.proc.pid else None
        return None

    wait_for("its servers", written, cli)
    return written()


def start_serve(home: Path, started: list[Cli], schedules: str = NIGHTLY) -> tuple[Cli, Any]:
    """``robo-pipe serve`` on ``home`` with its own servers, once its runner polls: the CLI and
    its ``services.json``."""
    serve = Cli(["serve", "--config", CONFIG, *SETS, "--set", schedules], home)
    started.append(serve)
    state = servers_of(serve)
    wait_for("the runner", lambda: runner_polling(state["prefect_api_url"]), serve)
    return serve, state


def finished_runs_since(api: str, since: float) -> list[str]:
    """Names of the flow runs on ``api`` that started after the wall-clock time ``since`` and
    have ended."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        runs = client.read_flow_runs()
    return [
        r.name
        for r in runs
        if r.state and r.state.is_final() and r.start_time and r.start_time.timestamp() > since
    ]


def test_a_killed_prefect_server_is_started_again_on_its_port_and_serving_goes_on(
    home_path: Path, started: list[Cli]
) -> None:
    serve, state = start_serve(home_path, started, CHECK)
    api = state["prefect_api_url"]
    [prefect, _] = state["servers"]

    killed_at = time.monotonic()
    os.kill(prefect["pid"], signal.SIGKILL)
    wait_for("serve to say so", lambda: "is back on port" in serve.output(), serve, 150)
    back_in, back = time.monotonic() - killed_at, time.time()
    wait_for("a run after the restart", lambda: finished_runs_since(api, back), serve, 150)
    ran_in = time.monotonic() - killed_at

    stop_start = time.monotonic()
    output = serve.stop()
    stopped_in = time.monotonic() - stop_start
    print(
        f"server back {back_in:.1f} s after its kill -9, a run started after that ended "
        f"{ran_in:.1f} s after it; SIGTERM to exit {stopped_in:.1f} s"
    )
    lines = [line for line in output.splitlines() if "Prefect server at" in line]
    assert len(lines) == 1 and f"pid {prefect['pid']}) exited with code -9" in lines[0], output
    assert f"starting it again on port {prefect['port']}" in lines[0]
    traceback_free(output)
    assert serve.proc.returncode == 143, output[-3000:]
    assert not _kill_all(home_path), "every process serve started has ended"
    assert stopped_in < (bound := bound_s(STOP_BOUND_S, EXIT_STARTS)), (
        f"serve took {stopped_in:.1f} s to stop (bound {bound:.1f} s)"
    )


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_with_its_server_gone_a_signal_stops_serve_within_the_bound(
    signum: int, home_path: Path, started: list[Cli]
) -> None:
    serve, state = start_serve(home_path, started)
    [prefect, mlflow] = state["servers"]

    os.kill(prefect["pid"], signal.SIGKILL)
    time.sleep(0.5)  # gone, and not started again yet (serve looks every 2 s)
    start = time.monotonic()
    if signum == signal.SIGINT:
        os.killpg(serve.proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the whole group
    else:
        serve.proc.send_signal(signal.SIGTERM)
    try:
        serve.proc.wait(timeout=STOP_BOUND_S + 30)
    except Exception:
        pytest.fail(f"serve still running {STOP_BOUND_S + 30} s after the signal")
    stopped_in = time.monotonic() - start
    print(f"{signal.Signals(signum).name} with the server gone: serve exited in {stopped_in:.1f} s")
    output = serve.output()
    traceback_free(output)
    assert serve.proc.returncode == 128 + signum, output[-3000:]
    assert stopped_in < (bound := bound_s(STOP_BOUND_S, EXIT_STARTS)), (
        f"serve took {stopped_in:.1f} s to stop (bound {bound:.1f} s)"
    )
    assert not _kill_all(home_path), "every process serve started has ended"
    assert _port_free(mlflow["port"]) and _port_free(prefect["port"])


def test_servers_of_a_killed_serve_exit_and_a_survivor_is_stopped_by_the_next_start(
    home_path: Path, started: list[Cli]
) -> None:
    # SIGKILL of serve: its servers get their parent-death signal and exit by themselves.
    serve, state = start_serve(home_path, started)
    pids = [s["pid"] for s in state["servers"]]
    ports = [s["port"] for s in state["servers"]]
    start = time.monotonic()
    os.kill(serve.proc.pid, signal.SIGKILL)
    while (pids_alive(pids) or home_processes(home_path)) and time.monotonic() - start < 30:
        time.sleep(0.2)
    gone_in = time.monotonic() - start
    print(f"servers of a SIGKILLed serve exited {gone_in:.1f} s after it")
    assert not pids_alive(pids) and not home_processes(home_path), home_processes(home_path)
    # Their own exits: a parent-death signal is delivered at once.
    assert gone_in < (bound := bound_s(0, 2 * EXIT_STARTS)), f"bound {bound:.1f} s"
    assert all(_port_free(port) for port in ports)

    # Without the parent-death signal (as an older robo-pipe started them) they survive; the
    # next start finds them, says so and stops them, and takes their ports back.
    os.environ["ROBO_PIPE_NO_PDEATHSIG"] = "1"
    try:
        serve, state = start_serve(home_path, started)
    finally:
        del os.environ["ROBO_PIPE_NO_PDEATHSIG"]
    pids = [s["pid"] for s in state["servers"]]
    ports = [s["port"] for s in state["servers"]]
    os.kill(serve.proc.pid, signal.SIGKILL)
    time.sleep(3)
    assert len(pids_alive(pids)) == 2, "the servers survived"
    # On the survivors' ports: ui takes them if they are free once it stopped the survivors.
    ui = Cli(["ui", "--prefect-port", str(ports[0]), "--mlflow-port", str(ports[1])], home_path)
    started.append(ui)
    new = servers_of(ui)
    output = ui.output()
    for server, port in zip(state["servers"], ports, strict=True):
        said = (
            f"found the {server['name']} (pid {server['pid']}, port {port}) left running by "
            f"robo-pipe serve (pid {serve.proc.pid}, gone): stopped it"
        )
        assert said in output, output[-3000:]
    assert not pids_alive(pids)
    assert [s["port"] for s in new["servers"]] == ports, "the ports were free again"
    ui.stop()
    assert ui.proc.returncode == 143


def test_serve_on_the_servers_of_a_ui_that_stops_says_so_and_exits_3(
    home_path: Path, started: list[Cli]
) -> None:
    ui = Cli(["ui"], home_path)
    started.append(ui)
    state = servers_of(ui)
    serve = Cli(["serve", "--config", CONFIG, *SETS, "--set", NIGHTLY], home_path)
    started.append(serve)
    wait_for("the runner", lambda: runner_polling(state["prefect_api_url"]), serve)
    assert f"using the servers of robo-pipe ui (pid {ui.proc.pid})" in serve.output()

    start = time.monotonic()
    ui.stop()
    try:
        serve.proc.wait(timeout=60)
    except Exception:
        pytest.fail(f"serve still running 60 s after its ui stopped: {serve.output()[-3000:]}")
    exited_in = time.monotonic() - start
    print(f"serve exited {exited_in:.1f} s after its ui was stopped")
    output = serve.output()
    traceback_free(output)
    assert serve.proc.returncode == 3, output[-3000:]
    said = [line for line in output.splitlines() if "stopped answering" in line]
    assert len(said) == 1, output[-3000:]
    assert f"the servers of robo-pipe ui (pid {ui.proc.pid})" in said[0]
    # Two misses of the 2 s watch, then the stop.
    assert exited_in < (bound := bound_s(2 * 2 * 2 + STOP_BOUND_S, EXIT_STARTS)), f"{bound:.1f} s"
    assert not _kill_all(home_path)
