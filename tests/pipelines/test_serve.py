"""Scheduled and UI-started runs through the real path, crashed runs, and clean shutdown.

Everything runs through the CLI in subprocesses, in one home for the module:

1. ``robo-pipe run`` on the tiny config (temporary local Prefect server) is killed with
   SIGKILL after its first stage; the same command again marks the killed flow run
   ``Crashed``, continues it (reusing the completed stage) and registers a champion, whose
   MLflow model carries a signature and a description.
2. ``robo-pipe serve`` starts its own Prefect server and MLflow UI and serves a retrain
   deployment (started twice through the Prefect API, as the UI's Run button does: the second
   run waits for the first) and a champion check on a 20 s interval (its scheduled runs
   execute; one that would overlap a running check is skipped).
3. SIGTERM stops ``serve`` within seconds, cancelling the check in progress: no process of the
   home is left and the servers' ports are free. SIGTERM while the servers are still starting
   (``serve`` and ``ui``) leaves nothing behind either.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.pace import bound_s
from tests.pipelines.test_flow import CONFIG, MODEL, TINY

ROOT = Path(__file__).resolve().parents[2]
SETS = [arg for s in TINY for arg in ("--set", s)]
SCHEDULES = (
    "schedules=[{name: retrain, flow: train_simulate_deploy, cron: '0 2 * * *', "
    "timezone: Europe/Berlin}, {name: check, flow: champion_regression, interval_s: 20}]"
)


@pytest.fixture
def home_path(shared_home: Path) -> Path:
    return shared_home


def cli_env(home: Path) -> dict[str, str]:
    """The environment of a robo-pipe subprocess in ``home``, with no Prefect server given."""
    env = {
        **os.environ,
        "ROBO_PIPE_HOME": str(home),
        "COLUMNS": "200",
        # Schedule new deployments' runs within a second and pick them up within two (the
        # defaults: a minute and ten seconds).
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
        "PREFECT_RUNNER_POLL_FREQUENCY": "2",
    }
    for name in ("PREFECT_API_URL", "MLFLOW_TRACKING_URI", "PREFECT_HOME"):
        env.pop(name, None)
    return env


def prefect_flow_runs(home: Path) -> dict[str, dict[str, Any]]:
    """Every flow run in the home's Prefect database, by id (read through a temporary server
    in a subprocess, as `robo-pipe run` writes them). Not by name: a run is renamed after its
    outcome when it ends, and two checks with the same outcome share a name."""
    script = (
        "import json\n"
        "from prefect.client.orchestration import get_client\n"
        "with get_client(sync_client=True) as client:\n"
        "    runs = client.read_flow_runs()\n"
        "print(json.dumps({str(r.id): {'name': r.name, 'state': r.state.type.value, "
        "'message': r.state.message, 'tags': r.tags} for r in runs}))\n"
    )
    env = {**cli_env(home), "PREFECT_HOME": str(home / "prefect")}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    runs: dict[str, dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return runs


@pytest.fixture(scope="module")
def resumed(shared_home: Path) -> dict[str, Any]:
    """A tiny `robo-pipe run` killed with SIGKILL after its first stage, then run again to
    the end: the killed run's lock-file record, the second run's result, its seconds."""
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "-c", CONFIG, *SETS, "--json"]
    env = cli_env(shared_home)
    # Its own process group: SIGKILL takes the temporary Prefect server down with it (left
    # behind, it would hold the home's Prefect database).
    first = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    stages, active = shared_home / "stages", shared_home / "runs" / ".active"
    deadline = time.monotonic() + 300
    while not list(stages.glob("collect-*.json")):
        assert first.poll() is None and time.monotonic() < deadline, "the first run died early"
        time.sleep(0.5)
    [lock_file] = list(active.glob("*.json"))
    killed = json.loads(lock_file.read_text())
    os.killpg(first.pid, signal.SIGKILL)
    first.wait()

    start = time.monotonic()
    again = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    result = json.loads(again.stdout.strip().splitlines()[-1])
    return {"killed": killed, "result": result, "seconds": time.monotonic() - start}


def test_a_killed_run_is_marked_crashed_and_the_rerun_continues_it(
    resumed: dict[str, Any], shared_home: Path
) -> None:
    from mlflow import MlflowClient

    from pipelines.services.settings import configure

    killed, result = resumed["killed"], resumed["result"]
    assert result["stages"]["collect"]["reused"], "the completed stage was reused"
    assert not result["stages"]["finetune"]["reused"]
    runs = prefect_flow_runs(shared_home)
    [old] = [r for r in runs.values() if r["name"] == killed["flow_run_name"]]
    new_id = result["links"]["Prefect flow run"].rsplit("/", 1)[1]
    new = runs[new_id]
    assert old["state"] == "CRASHED", old
    assert f"process {killed['pid']}" in old["message"]
    # Named by its id: the new run is renamed after its outcome once it ends.
    assert new_id in old["message"] and "continues it" in old["message"]
    assert new["state"] == "COMPLETED"
    assert f"continues:{killed['flow_run_name']}" in new["tags"]
    assert not list((shared_home / "runs" / ".active").iterdir()), "no lock left behind"
    assert not home_processes(shared_home)

    configure()
    mlflow = MlflowClient()
    dead = mlflow.get_run(killed["mlflow_run_id"])
    assert dead.info.status == "KILLED"
    assert dead.data.tags["robo_pipe.continued_by"] == result["mlflow_run_id"]
    stages = mlflow.search_runs(
        [dead.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{dead.info.run_id}'",
    )
    assert stages and all(run.info.status != "RUNNING" for run in stages)
    assert (
        mlflow.get_run(result["mlflow_run_id"]).data.tags["robo_pipe.continues_flow_runs"]
        == (killed["flow_run_id"])
    )


def test_the_registered_version_has_a_signature_and_a_description(
    resumed: dict[str, Any], shared_home: Path
) -> None:
    import mlflow

    from pipelines.services.settings import configure

    configure()
    info = mlflow.models.get_model_info(f"models:/{MODEL}@champion")
    assert info.signature is not None, "the model is logged with a signature"
    inputs = {s.name: (s.type.name, s.shape) for s in info.signature.inputs.inputs}
    outputs = {s.name: (s.type.name, s.shape) for s in info.signature.outputs.inputs}
    spec = json.loads((Path(resumed["result"]["export"]) / "io_spec.json").read_text())
    assert inputs == {
        "image_scene": ("uint8", (-1, 32, 32, 3)),
        "state": ("float32", (-1, spec["state_dim"])),
        "tokens": ("int64", (-1, spec["max_tokens"])),
        "token_mask": ("int64", (-1, spec["max_tokens"])),
    }
    chunk = (-1, spec["chunk_len"], spec["action_dim"])
    assert outputs == {"actions": ("float32", chunk), "action_std": ("float32", chunk)}

    version = mlflow.MlflowClient().get_model_version_by_alias(MODEL, "champion")
    text = version.description or ""
    result = resumed["result"]
    for gate in result["gates"]:
        assert f"- {gate}: **passed**" in text, gate
    low, high = result["ci95"]
    assert f"**{result['success_rate']:.1%}** (95% CI {low:.1%} - {high:.1%})" in text
    assert f"latency p99 **{result['latency_p99_ms']:.2f} ms**" in text
    # Lineage as paths under the home (the description opens anywhere, as summary.md does).
    for path in (result["dataset"], result["checkpoint"]):
        assert f"`{Path(path).relative_to(shared_home)}`" in text, path
    # The flow run that registered it, or a later one that found it registered (in `serve`).
    assert "- Prefect flow run: `" in text and "(id `" in text
    # No link to the embedded store's UI, whose port is whatever `robo-pipe ui` got that day.
    assert result["links"]["MLflow model version"] not in text and "127.0.0.1" not in text


def home_processes(home: Path) -> list[str]:
    """Command lines of the live processes started for ``home`` (its ROBO_PIPE_HOME is in
    their environment): servers, runners, flow runs."""
    marker = f"ROBO_PIPE_HOME={home}\0".encode()
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes() and int(proc.name) != os.getpid():
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode()
                if cmdline and (proc / "stat").read_text().split()[2] != "Z":
                    found.append(f"{proc.name}: {cmdline[:200]}")
        except OSError:  # it ended meanwhile, or is not ours to read
            continue
    return found


def _port_free(port: int) -> bool:
    """Nothing listens on ``port`` and a server could bind it again now."""
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            return False
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Cli:
    """A long-running robo-pipe verb in ``home``, its output in a file (a pipe nobody reads
    while it runs would fill up and block it).

    It starts as a terminal starts a command: SIGINT at its default (Ctrl-C stops it), whatever
    this process has. A pytest started as a script's background job (``make test &``, or a CI
    runner's) has SIGINT ignored, and a child inherits an ignored signal through fork and exec:
    every Ctrl-C a test sends would then reach nothing (a verb keeps an ignored SIGINT ignored).
    ``sigint_ignored`` starts it as such a background job instead."""

    def __init__(self, args: list[str], home: Path, sigint_ignored: bool = False) -> None:
        self.home = home
        self.log = home.parent / f"{args[0]}-{time.monotonic_ns()}.log"
        sigint = signal.SIG_IGN if sigint_ignored else signal.SIG_DFL
        with self.log.open("w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "pipelines.cli", *args],
                cwd=ROOT,
                env=cli_env(home),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=lambda: signal.signal(signal.SIGINT, sigint),
            )

    def output(self) -> str:
        """Everything it printed so far."""
        return self.log.read_text(errors="replace")

    def alive(self) -> bool:
        """Still running."""
        return self.proc.poll() is None

    def stop(self) -> str:
        """SIGTERM it and return its output; if it is still running a minute later, kill
        every process of its home so that a failing test leaves nothing behind either."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            _kill_all(self.home)
            self.proc.wait()
            return f"(killed: still running 60 s after SIGTERM)\n{self.output()}"
        return self.output()


@pytest.fixture
def serving(resumed: dict[str, Any], shared_home: Path) -> Iterator[Cli]:
    """`robo-pipe serve` on the tiny config, its own servers started (no PREFECT_API_URL)."""
    serve = Cli(["serve", "-c", CONFIG, *SETS, "--set", SCHEDULES], shared_home)
    yield serve
    if serve.alive():  # the test failed before stopping it
        serve.stop()


def _kill_all(home: Path) -> list[str]:
    """Kill what is left of ``home``'s processes (a failing test leaves nothing behind either)
    and return what that was."""
    left = home_processes(home)
    for line in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split(":")[0]), signal.SIGKILL)
    return left


def _wait_for(what: str, check: Any, timeout_s: float, serve: Cli) -> Any:
    """``check()`` once it is truthy; fails if ``serve`` exits or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        assert serve.alive(), f"serve exited: {serve.output()[-3000:]}"
        time.sleep(1)
    pytest.fail(f"timed out waiting for {what}; serve said:\n{serve.stop()[-3000:]}")


def test_served_deployments_run_scheduled_and_manual_runs_then_sigterm_stops_everything(
    serving: Cli, shared_home: Path
) -> None:
    from mlflow import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName
    from prefect.settings import PREFECT_API_URL, temporary_settings
    from prefect.states import Cancelled, Completed, Running

    from pipelines.serve.deployments import SHUTDOWN_MESSAGE
    from pipelines.services.settings import configure

    def wait_for(what: str, check: Any, timeout_s: float) -> Any:
        return _wait_for(what, check, timeout_s, serving)

    start = time.monotonic()
    state_file = shared_home / "services.json"
    wait_for("serve's servers", state_file.is_file, 180)
    servers = json.loads(state_file.read_text())
    api = servers["prefect_api_url"]

    def runs_of(client: Any, deployment: str) -> list[Any]:
        return list(
            client.read_flow_runs(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
            )
        )

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:

        def deployments() -> dict[str, Any]:
            found = {d.name: d for d in client.read_deployments()}
            return found if {"retrain", "check"} <= set(found) else {}

        registered = wait_for("both deployments", deployments, 120)
        phases = {"deployments registered": time.monotonic() - start}
        retrain, check = registered["retrain"], registered["check"]
        assert retrain.global_concurrency_limit.limit == 1
        assert check.global_concurrency_limit.limit == 1
        assert retrain.concurrency_options.collision_strategy.value == "ENQUEUE"
        assert check.concurrency_options.collision_strategy.value == "CANCEL_NEW"
        assert retrain.schedules[0].schedule.cron == "0 2 * * *"
        assert retrain.schedules[0].schedule.timezone == "Europe/Berlin"

        # Two retrains started at once through the API, as the UI's Run button does: the
        # second waits for the first, then both run to the end.
        manual = [client.create_flow_run_from_deployment(retrain.id) for _ in range(2)]
        seen: set[str] = set()

        def retrains_done() -> bool:
            states = [state for r in manual if (state := client.read_flow_run(r.id).state)]
            seen.update(str(state.name) for state in states)
            assert not any(s.is_final() and not s.is_completed() for s in states), states
            return len(states) == len(manual) and all(s.is_completed() for s in states)

        wait_for("the manual retrains", retrains_done, 300)
        phases["both retrains Completed"] = time.monotonic() - start
        assert "AwaitingConcurrencySlot" in seen, f"the second run waited: {seen}"

        def scheduled_check_done() -> list[Any]:
            runs = runs_of(client, "check")
            return [r for r in runs if r.auto_scheduled and r.state and r.state.is_completed()]

        [completed_check, *_] = wait_for("a scheduled check", scheduled_check_done, 300)
        phases["a scheduled check Completed"] = time.monotonic() - start
        skipped = [r for r in runs_of(client, "check") if r.state and r.state.is_cancelled()]
        for run in skipped:  # a check that would overlap a running one says why it did not run
            assert "concurrency" in (run.state.message or "").lower(), run.state

        def check_in_progress() -> list[Any]:
            # Just started (a check runs for several seconds), so it is still running when
            # the signal lands.
            now = datetime.now(UTC)
            runs = runs_of(client, "check")
            return [
                r
                for r in runs
                if r.state and r.state.is_running() and (now - r.state.timestamp).seconds < 2
            ]

        # What Prefect 3.8's stopping runner does to a run that completed a moment ago (its
        # process still exiting): force it Cancelled. `serve` gives it its Completed back.
        raced = client.create_flow_run_from_deployment(retrain.id, state=Running())
        client.set_flow_run_state(raced.id, Completed(), force=True)
        client.set_flow_run_state(raced.id, Cancelled(message=SHUTDOWN_MESSAGE), force=True)

        [in_progress, *_] = wait_for("a check in progress", check_in_progress, 120)

    stop = time.monotonic()
    output = serving.stop()
    stopped_in = time.monotonic() - stop
    phases["SIGTERM to exit"] = stopped_in
    print(", ".join(f"{phase} {seconds:.1f} s" for phase, seconds in phases.items()))
    assert serving.proc.returncode == 143 and "stopped" in output, output[-3000:]  # 128 + 15
    # A bound on hanging, not a speed figure: about 10 s on a quiet machine (README), 22 s was
    # seen with a `make demo` sharing the 2 cores; the phases printed above are the figures.
    assert stopped_in < 60, f"serve took {stopped_in:.1f} s to stop"
    assert "temporary server" not in output.lower(), "every run used serve's own server"
    ports = [int(url.rsplit(":", 1)[1].split("/")[0]) for url in (api, servers["mlflow_ui"])]
    assert all(_port_free(port) for port in ports), f"a server still holds one of {ports}"
    assert not state_file.exists()
    assert not _kill_all(shared_home), "every process serve started has ended"

    # The check in progress was stopped (Cancelled) or, having no task boundary to stop at,
    # finished first: either way it does not stay Running.
    runs = prefect_flow_runs(shared_home)
    stopped = runs[str(in_progress.id)]
    assert stopped["state"] in ("CANCELLED", "COMPLETED"), stopped
    assert stopped["state"] == "COMPLETED" or stopped["message"] == SHUTDOWN_MESSAGE, stopped
    assert all(runs[str(r.id)]["state"] == "COMPLETED" for r in [*manual, raced, completed_check])

    configure()
    mlflow = MlflowClient()
    status = {}
    for flow_run in [*manual, completed_check, in_progress]:
        tracked = mlflow.search_runs(
            [e.experiment_id for e in mlflow.search_experiments()],
            filter_string=f"tags.robo_pipe.prefect_flow_run_id = '{flow_run.id}'",
        )
        status[flow_run.id] = [run.info.status for run in tracked]
    assert all(status[r.id] == ["FINISHED"] for r in [*manual, completed_check]), status
    # The stopped check's MLflow run, if it got as far as opening one, has ended too.
    assert "RUNNING" not in status[in_progress.id]
    champion = mlflow.get_model_version_by_alias(MODEL, "champion")
    assert "robo_pipe.last_regression_at" in champion.tags, "the scheduled check tagged it"


@pytest.mark.parametrize("verb", ["serve", "ui"])
def test_sigterm_while_the_servers_start_leaves_nothing_behind(verb: str, tmp_path: Path) -> None:
    home = tmp_path / "starting"
    args = ["serve", "-c", CONFIG, *SETS, "--set", SCHEDULES] if verb == "serve" else ["ui"]
    home.mkdir(parents=True)
    proc = Cli(args, home)
    log = home / "mlflow" / "server.log"  # opened just before the MLflow server starts
    deadline = time.monotonic() + 60
    while not log.is_file():
        assert proc.alive() and time.monotonic() < deadline, proc.output()
        time.sleep(0.1)
    time.sleep(2)  # both servers are starting, neither answers yet
    assert not (home / "services.json").exists(), "the servers were meant to be starting"
    stop = time.monotonic()
    output = proc.stop()
    stopped_in = time.monotonic() - stop
    print(f"{verb}: SIGTERM while starting to exit {stopped_in:.1f} s")
    left = _kill_all(home)
    assert proc.proc.returncode == 143, output[-3000:]  # 128 + SIGTERM
    # Its servers are stopped with 5 s of grace each, then its own exit.
    assert stopped_in < (bound := bound_s(10, 5)), f"{verb}: {stopped_in:.1f} s (bound {bound:.1f})"
    assert not left, "every server it started has ended"
