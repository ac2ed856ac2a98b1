"""The pipeline against the Prefect server (+ MLflow UI) of a running `robo-pipe ui`, found
without configuration; then `robo-pipe serve` registers a scheduled deployment whose scheduled
run executes. Everything runs through the CLI in subprocesses. (Servers started by hand and a
two-node Ray cluster: tests/pipelines/test_cluster.py.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.services.local_servers import free_port
from pipelines.services.settings import healthy
from tests.pipelines.test_flow import CONFIG, MODEL, TINY

ROOT = Path(__file__).resolve().parents[2]


def ctrl_c_reaches_it() -> None:
    """In the child before exec: SIGINT back to its default, as in a terminal. The test sends
    Ctrl-C's SIGINT; a pytest started as a script's background job (`make test &`) has SIGINT
    ignored, the child would inherit that, and a verb keeps an ignored SIGINT ignored
    (services.signals.stop_on_sigterm): the test would wait for nothing."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("scale-out") / "home"


@pytest.fixture(scope="module")
def servers(home: Path) -> Iterator[dict[str, str]]:
    """`robo-pipe ui`: the local Prefect server and MLflow UI of this home."""
    env = {
        **os.environ,
        "ROBO_PIPE_HOME": str(home),
        # Schedule new deployments' runs within a second instead of the default minute.
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "1",
    }
    env.pop("PREFECT_API_URL", None)
    ports = ["--prefect-port", str(free_port()), "--mlflow-port", str(free_port())]
    ui = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "ui", *ports],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    state_file = home / "services.json"
    for _ in range(180):
        if state_file.is_file():
            break
        assert ui.poll() is None, ui.stdout.read() if ui.stdout else ""
        time.sleep(1)
    state = json.loads(state_file.read_text())
    yield state
    ui.send_signal(signal.SIGINT)
    ui.wait(timeout=60)
    assert not healthy(f"{state['prefect_api_url']}/health"), "Ctrl-C stops the servers"
    assert not state_file.exists()


def robo_pipe(
    *args: str, home: Path, env: dict[str, str], timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """``robo-pipe ARGS`` in a subprocess with ``env`` and ``home`` as its ROBO_PIPE_HOME."""
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**env, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_pipeline_on_the_servers_of_robo_pipe_ui_then_a_scheduled_run(
    home: Path, servers: dict[str, str]
) -> None:
    env = dict(os.environ)
    assert healthy(servers["mlflow_ui"]), "the MLflow UI answers"
    info = robo_pipe("info", "--json", home=home, env={**env, "PREFECT_API_URL": ""})
    found = json.loads(info.stdout.strip().splitlines()[-1])
    assert found["prefect_api_url"] == servers["prefect_api_url"], "robo-pipe ui is discovered"
    assert found["mlflow_tracking_uri"].startswith("sqlite:///") and found["mlflow_ui"]

    # No PREFECT_API_URL: the run finds the running `robo-pipe ui` and reports to its server.
    sets = [arg for s in TINY for arg in ("--set", s)]
    run = robo_pipe(
        "run", "-c", CONFIG, *sets, "--json", home=home, env={**env, "PREFECT_API_URL": ""}
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["promoted"] and result["links"]["Prefect flow run"].startswith(
        servers["prefect_ui"]
    )
    assert result["links"]["MLflow run"].startswith(servers["mlflow_ui"])
    assert "robo-pipe ui` runs" not in run.stdout, "both UIs were running"

    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: servers["prefect_api_url"]}):
        flow_run_id = result["links"]["Prefect flow run"].rsplit("/", 1)[1]
        with get_client(sync_client=True) as client:
            state = client.read_flow_run(flow_run_id).state
            assert state is not None and state.is_completed()

        # A deployment on a 5 s interval: registered, scheduled, and one run executes
        # (evaluating in-process: a local Ray per run is too slow beside the cluster on 2 cores).
        tiny = [arg for s in TINY for arg in ("--set", s)]
        # The nightly cron never fires here; validating a cron imports Prefect before serve
        # finds the server, which once sent part of every served run to a temporary one.
        schedule = (
            "schedules=[{name: regression-check, flow: champion_regression, interval_s: 5}, "
            "{name: nightly, flow: train_simulate_deploy, cron: '0 2 * * *'}]"
        )
        # No PREFECT_API_URL: serve finds the running `robo-pipe ui` and its runs report there.
        serve = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "serve",
                "-c",
                CONFIG,
                *tiny,
                "--set",
                schedule,
            ],
            cwd=ROOT,
            env={**env, "PREFECT_API_URL": "", "ROBO_PIPE_HOME": str(home)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            preexec_fn=ctrl_c_reaches_it,
        )
        try:
            completed = _wait_for_scheduled_run("regression-check")
        finally:
            serve.send_signal(signal.SIGINT)
            output = serve.communicate(timeout=60)[0]
        assert completed, output[-3000:]
        assert serve.returncode == 130 and "stopped" in output  # 128 + SIGINT
    shown = robo_pipe("models", "show", f"{MODEL}@champion", "--json", home=home, env=env)
    tags = json.loads(shown.stdout.strip().splitlines()[-1])[0]["tags"]
    assert "robo_pipe.last_regression_at" in tags, "the scheduled regression check ran"


def _wait_for_scheduled_run(deployment: str, timeout_s: float = 240.0) -> bool:
    """True once a scheduled run of the deployment named ``deployment`` completed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            runs = client.read_flow_runs(
                deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[deployment]))
            )
            if any(r.state is not None and r.state.is_completed() for r in runs):
                assert all(r.auto_scheduled for r in runs if r.state and r.state.is_completed())
                return True
            time.sleep(2)
    return False


def test_prefect_yaml_deployments_point_at_real_flows() -> None:
    from prefect.flows import load_flow_from_entrypoint
    from prefect.schedules import Cron

    from pipelines.serve.deployments import OVERLAP

    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    names = set()
    for deployment in spec["deployments"]:
        flow: Any = load_flow_from_entrypoint(str(ROOT / deployment["entrypoint"]))
        names.add(flow.name)
        # The same one-at-a-time policy as `robo-pipe serve`.
        assert deployment["concurrency_limit"] == {
            "limit": 1,
            "collision_strategy": OVERLAP[flow.name],
        }
        assert (ROOT / deployment["parameters"]["config"]).is_file()
        for schedule in deployment["schedules"]:
            Cron(schedule["cron"], timezone=schedule["timezone"])
        assert deployment["work_pool"]["name"]
    assert names == {"train_simulate_deploy", "champion_regression"}
