"""Operating a fleet after a rollout, through the CLI against real edge agents (the fixtures of
``test_fleet``): ``deploy --fleet --retry-failed`` deploys only the devices a rollout did not
leave on the version, ``fleet rollback`` returns the devices a rollout updated to what they
ran before (the agent records the rollout as the rollback's origin), ``--resume`` refuses a
rollout that completed, and bad input is refused in under 2 s, before Prefect or MLflow."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from tests.pace import bound_s, cli_start_s
from tests.pipelines.test_deploy import MODEL, TOKEN
from tests.pipelines.test_fleet import (  # noqa: F401  (module fixtures)
    TOKEN_ENV,
    active,
    cli,
    put_on_v1,
    record,
    registered,
    rollout,
    rows,
    signing,
    start_fleet,
    stop_fleet,
    task_runs,
    write_fleet,
)
from tests.pipelines.test_flow import ROOT

pytestmark = pytest.mark.usefixtures("prefect_server", "services_here")


@pytest.fixture
def home_path(shared_home: Path) -> Path:
    return shared_home


def restart(agent: dict[str, Any], folder: Path, home: Path) -> None:
    """Start a stopped agent again on its own config (same port, same state)."""
    config = str(folder / "device.yaml")
    agent["process"] = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "edge-agent", "--device-config", config],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", agent["port"])) == 0:
                return
        time.sleep(0.2)
    raise AssertionError("the agent did not come back")


def history(agent: dict[str, Any]) -> list[dict[str, Any]]:
    answer = httpx.get(
        f"http://127.0.0.1:{agent['port']}/history", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    answer.raise_for_status()
    return list(answer.json())


def latest_rollout(fleet: Path) -> str:
    from pipelines.deploy import rollouts

    found = rollouts.latest(fleet)
    assert found is not None, "the rollout left no record"
    return found.id


def test_retry_failed_touches_only_the_failed_device_and_fleet_rollback_undoes_a_rollout(
    registered: str,  # noqa: F811
    signing: Path,  # noqa: F811
    shared_home: Path,
    tmp_path: Path,
) -> None:
    """arm-r is down during the rollout of v2 (canary ops-a, then ops-b and arm-r at once, one
    failure allowed): ops-a and ops-b take v2, arm-r is unreachable. It comes back;
    --retry-failed deploys v2 to arm-r alone (the others' history unchanged). Then fleet
    rollback of the first rollout puts ops-a and ops-b back on v1 by the agent's rollback,
    recorded with that rollout's id, the version's tags say reverted; arm-r, which that
    rollout never updated, stays on v2."""
    from pipelines.registry.versions import get_version

    names = ["ops-a", "ops-b", "arm-r"]
    agents = start_fleet(shared_home, tmp_path, names)
    try:
        put_on_v1(shared_home, signing, agents, names)
        agents["arm-r"]["process"].terminate()
        agents["arm-r"]["process"].wait(timeout=20)
        # The file pauses a minute between waves and deploys a wave at once; the command
        # line says no pause and one device at a time.
        policy = {"canary": 1, "waves": [2], "max_failures": 1, "pause_s": 60}
        fleet = write_fleet(tmp_path / "fleet.yaml", agents, ["ops-a", "ops-b", "arm-r"], policy)
        first = rollout(fleet, shared_home, signing, "--max-parallel", "1", "--pause", "0")
        assert first.returncode == 1, first.stderr[-3000:]  # arm-r: not every device
        result = record(first)
        assert rows(result)["arm-r"]["state"] == "unreachable"
        assert result["seconds"] < 60, "--pause 0 overrides the file's pause_s"
        runs = {t.name.rsplit("-wave", 1)[0]: t for t in task_runs(result["flow_run_id"])}
        assert runs["ops-b"].end_time <= runs["arm-r"].start_time, "--max-parallel 1"
        first_id = latest_rollout(fleet)

        restart(agents["arm-r"], tmp_path / "arm-r", shared_home)
        untouched = {n: len(history(agents[n])) for n in ("ops-a", "ops-b")}
        retry = rollout(fleet, shared_home, signing, "--retry-failed", first_id)
        assert retry.returncode == 0, retry.stderr[-3000:]
        assert [r["device"] for r in record(retry)["devices"]] == ["arm-r"]
        assert active(agents["arm-r"]) == f"{MODEL}:2"
        assert {n: len(history(agents[n])) for n in untouched} == untouched

        again = rollout(fleet, shared_home, signing, "--resume", latest_rollout(fleet))
        assert again.returncode == 2 and "nothing to resume" in again.stderr, again.stderr
        # The first rollout ended incomplete: resuming it goes to arm-r alone, which the retry
        # already put on v2, so nothing is deployed again.
        deployed = len(history(agents["arm-r"]))
        resumed = rollout(fleet, shared_home, signing, "--resume", first_id)
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        [row] = record(resumed)["devices"]
        assert row["device"] == "arm-r" and row["state"] == "active", row
        assert len(history(agents["arm-r"])) == deployed, "a device on the version: not again"

        back = cli(
            "fleet", "rollback", str(fleet), "--rollout", first_id, "--json", home=shared_home
        )
        assert back.returncode == 0, back.stderr[-3000:]
        undone = rows(record(back))
        assert set(undone) == {"ops-a", "ops-b"}, "only the devices that rollout updated"
        for name in ("ops-a", "ops-b"):
            assert undone[name]["state"] == "reverted" and undone[name]["after"] == f"{MODEL}:1"
            assert active(agents[name]) == f"{MODEL}:1"
            last = history(agents[name])[0]  # newest first
            assert last["state"] == "rolled_back" and last["origin"], last
            assert last["origin"]["rollout"] == first_id and last["origin"]["by"] == "fleet"
        assert active(agents["arm-r"]) == f"{MODEL}:2"
        tags = get_version(MODEL, "2").tags
        assert tags["robo_pipe.device.ops-a.state"] == "reverted"
        assert tags["robo_pipe.device.ops-a.version"] == f"{MODEL}:1"
    finally:
        stop_fleet(agents)


def test_bad_input_is_refused_within_a_cli_start_before_any_server(
    registered: str,  # noqa: F811
    shared_home: Path,
    tmp_path: Path,
) -> None:
    """A fleet file with a bad field, an unset token variable, an unknown rollout id and a
    registry nobody listens for: one line, exit 2 (3 for the registry), each within 2.5 CLI
    start-ups at the machine's present pace (:mod:`tests.pace`; 2 s on 2 quiet cores): the verb
    checks them before Prefect, MLflow or the flow's module load (the checks take ~0.5 s)."""
    from pipelines.services.local_servers import free_port

    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"devices": [{"name": "a"}]}))
    unset = tmp_path / "unset.yaml"
    entry = {"name": "a", "url": "http://127.0.0.1:9", "token_env": "F3_UNSET_TOKEN"}
    unset.write_text(yaml.safe_dump({"devices": [entry]}))
    uri = f"models:/{MODEL}/1"
    cases: list[tuple[list[str], dict[str, str], int, str]] = [
        (["--fleet", str(bad)], {}, 2, "devices.0.url"),
        (["--fleet", str(unset)], {}, 2, "F3_UNSET_TOKEN"),
        (["--fleet", str(unset), "--retry-failed", "no-such-rollout"], {}, 2, "no-such-rollout"),
        (
            ["--fleet", str(unset)],
            {"F3_UNSET_TOKEN": TOKEN, "MLFLOW_TRACKING_URI": f"http://127.0.0.1:{free_port()}"},
            3,
            "MLflow",
        ),
    ]
    os.environ.pop("F3_UNSET_TOKEN", None)
    # 2 s on 2 quiet cores: a CLI start-up takes ~0.8 s there; the checks ~0.5 s.
    pace = cli_start_s()
    for args, env, code, said in cases:
        start = time.perf_counter()
        done = _robo_pipe_bare(shared_home, "deploy", uri, *args, **env)
        seconds = time.perf_counter() - start
        assert done.returncode == code and said in done.stderr, (args, done.stderr[-2000:])
        assert "Traceback" not in done.stderr
        bound = bound_s(0, 2.5, pace)
        if seconds >= bound:  # the load moved since the pace was measured: measure it again now
            bound = bound_s(0, 2.5, max(pace, cli_start_s()))
        assert seconds < bound, f"{args}: {seconds:.2f} s ({bound:.2f})"


def _robo_pipe_bare(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``robo-pipe ARGS`` with only the home set (no Prefect API: nothing may start one)."""
    base = {k: v for k, v in os.environ.items() if k not in ("PREFECT_API_URL", TOKEN_ENV)}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**base, "ROBO_PIPE_HOME": str(home), **env},
        capture_output=True,
        text=True,
    )
