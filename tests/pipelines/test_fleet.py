"""``robo-pipe deploy --fleet`` and ``robo-pipe fleet status`` through the CLI against real edge
agents on 127.0.0.1 (each in its own state directory; one whose latency budget no machine
meets, so it fails its gate), a device nobody listens for, a real Prefect test server and the
SQLite MLflow registry: the canary stops a bad rollout, a failing wave rolls the updated
devices back, an unreachable device is reported and counted, a dry run changes nothing, and
the rollout is on record (model-version tags, one Prefect task run per device)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import yaml

from pipelines.services.local_servers import free_port
from tests.pipelines.test_deploy import MODEL, TOKEN, registered, start_agent
from tests.pipelines.test_deploy import status as agent_status
from tests.pipelines.test_flow import robo_pipe

__all__ = ["registered"]  # the module fixture: edge-policy v1 and v2

TOKEN_ENV = "FLEET_TOKEN"
AGENT: dict[str, Any] = {"gate_steps": 20, "gate_warmup": 2, "health_ticks": 5}
"""Small agents: a short gate and health check (unpaced, as start_agent sets)."""


@pytest.fixture
def home_path(shared_home: Path) -> Path:
    return shared_home


pytestmark = pytest.mark.usefixtures("prefect_server", "services_here")


@pytest.fixture(scope="module")
def signing(shared_home: Path) -> Path:
    """The release key pair agents trust (start_agent trusts ``keys/release.pub``)."""
    from deploy_edge.keys import generate_keypair

    private, _ = generate_keypair(shared_home / "keys", "release")
    return private


def target(folder: Path, fails: bool) -> Path:
    """The local-cpu profile with a p99 budget no machine meets (every gate fails), or one
    none misses (several agents share two busy cores: their gates must not fail by chance)."""
    from configs import targets_dir

    profile = yaml.safe_load((targets_dir() / "local-cpu.yaml").read_text())
    if fails:
        profile.update(name="tiny-budget", budget_ms=0.0001)
    else:
        profile.update(name="lax-budget", budget_ms=10_000.0, allowed_misses=1_000)
    path = folder / f"{profile['name']}.yaml"
    path.write_text(yaml.safe_dump(profile))
    return path


def start_fleet(
    home: Path, root: Path, names: list[str], failing: tuple[str, ...] = ()
) -> dict[str, dict[str, Any]]:
    """A real agent per name, started at once, each in its own folder under ``root``."""

    def one(name: str) -> dict[str, Any]:
        folder = root / name
        folder.mkdir(parents=True)
        profile = target(folder, fails=name in failing)
        return start_agent(home, folder, name=name, target=str(profile), **AGENT)

    with ThreadPoolExecutor(len(names)) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def stop_fleet(agents: dict[str, dict[str, Any]]) -> None:
    for agent in agents.values():
        agent["process"].terminate()
    for agent in agents.values():
        agent["process"].wait(timeout=20)


def write_fleet(
    path: Path,
    agents: dict[str, dict[str, Any]],
    order: list[str],
    rollout: dict[str, Any] | None = None,
    ghost: str | None = None,
) -> Path:
    """A fleet file with the agents in ``order`` (``ghost``: a device nobody listens for)."""
    devices = []
    for i, name in enumerate(order):
        port = free_port() if name == ghost else agents[name]["port"]
        devices.append(
            {
                "name": name,
                "url": f"http://127.0.0.1:{port}",
                "token_env": TOKEN_ENV,
                "labels": {"site": "lab" if i % 2 == 0 else "plant", "robot": "rp5"},
            }
        )
    path.write_text(yaml.safe_dump({"devices": devices, "rollout": rollout or {}}))
    return path


def cli(*args: str, home: Path) -> Any:
    from prefect.settings import PREFECT_API_URL

    return robo_pipe(
        *args, home=home, PREFECT_API_URL=str(PREFECT_API_URL.value()), **{TOKEN_ENV: TOKEN}
    )


def rollout(fleet: Path, home: Path, key: Path, *extra: str, version: int = 2) -> Any:
    return cli(
        "deploy", f"models:/{MODEL}/{version}", "--fleet", str(fleet), "--key", str(key),
        "--json", *extra, home=home,
    )  # fmt: skip


def record(done: Any) -> dict[str, Any]:
    assert done.stdout.strip(), done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def rows(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["device"]: r for r in result["devices"]}


def active(agent: dict[str, Any]) -> str | None:
    from tests.pipelines.test_deploy import status

    slot = status(agent)["active"]
    return f"{slot['model_name']}:{slot['model_version']}" if slot else None


def put_on_v1(home: Path, key: Path, agents: dict[str, dict[str, Any]], names: list[str]) -> None:
    """The baseline: ``names`` run v1 (deployed directly, all at once)."""
    from deploy_edge.device import DeviceEntry
    from pipelines.deploy.release import bundle_release, deploy_release
    from pipelines.registry.versions import get_version

    os.environ[TOKEN_ENV] = TOKEN
    _, path = bundle_release(get_version(MODEL, "1"), key)

    def one(name: str) -> str:
        url = f"http://127.0.0.1:{agents[name]['port']}"
        return deploy_release(DeviceEntry(name=name, url=url, token_env=TOKEN_ENV), path)[0].state

    with ThreadPoolExecutor(len(names)) as pool:
        assert list(pool.map(one, names)) == ["active"] * len(names)


def flow_state(flow_run_id: str) -> str:
    """The flow run's final state type (``COMPLETED``, ``FAILED``, ``CANCELLED``, ...)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(UUID(flow_run_id))
    assert flow_run.state is not None
    return str(flow_run.state.type.value)


def task_runs(flow_run_id: str) -> list[Any]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as prefect:
        flow_run = prefect.read_flow_run(UUID(flow_run_id))
        assert flow_run.name and flow_run.state is not None and flow_run.state.is_final()
        found = prefect.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
        )
    return list(found)


def task_states(flow_run_id: str) -> dict[str, tuple[str, str]]:
    """Each device's task run: its state type and message."""
    found = {}
    for run in task_runs(flow_run_id):
        assert run.state is not None
        found[run.name.rsplit("-wave", 1)[0]] = (run.state.type.value, run.state.message or "")
    return found


@pytest.fixture(scope="module")
def idle_fleet(
    registered: str, signing: Path, shared_home: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, dict[str, Any]]]:
    """Two agents the read-only tests share (a dry run, a rollout stopped before any deploy)."""
    agents = start_fleet(shared_home, tmp_path_factory.mktemp("idle-fleet"), ["idle-a", "idle-b"])
    yield agents
    stop_fleet(agents)


def test_a_rollout_reaches_every_device_and_is_on_record(
    registered: str, signing: Path, shared_home: Path, tmp_path: Path
) -> None:
    """Canary, then a wave of two at once: every device runs v1; the model version's tags say
    where it runs (`models show`), the flow run has one task run per device, `fleet status`
    shows it; a device nobody listens for is reported (one failure allowed: not stopped)."""
    from pipelines.registry.versions import get_version

    names = ["arm-a", "arm-b", "arm-c"]
    agents = start_fleet(shared_home, tmp_path, names)
    try:
        fleet = write_fleet(
            tmp_path / "fleet.yaml",
            agents,
            [*names, "ghost"],
            {"canary": 1, "waves": [2], "max_failures": 1},
            ghost="ghost",
        )
        done = rollout(fleet, shared_home, signing, version=1)
        assert done.returncode == 1, done.stderr[-3000:]  # not every device: the ghost
        result = record(done)
        assert result["stopped_at_wave"] is None and result["waves"] == [
            ["arm-a"],
            ["arm-b", "arm-c", "ghost"],
        ]
        by_device = rows(result)
        for name in names:
            row = by_device[name]
            assert row["state"] == "active" and row["after"] == f"{MODEL}:1", row
            assert row["before"] is None and row["p99_ms"] > 0
            assert row["sent_bytes"] > 0, "a first rollout sends the whole release"
            assert active(agents[name]) == f"{MODEL}:1"
        ghost = by_device["ghost"]
        assert ghost["state"] == "unreachable" and "127.0.0.1" in ghost["reason"], ghost
        assert "unreachable" in done.stderr and "not every device runs" in done.stderr
        for column in ("device", "before", "after", "state", "reason", "on-device p99", "sent"):
            assert column in done.stderr
        assert by_device["ghost"]["sent_bytes"] is None, "nothing was sent to it"

        tags = get_version(MODEL, "1").tags
        for name in names:
            assert tags[f"robo_pipe.device.{name}.version"] == f"{MODEL}:1"
            assert tags[f"robo_pipe.device.{name}.state"] == "active"
            assert float(tags[f"robo_pipe.device.{name}.p99_ms"]) > 0
            assert tags[f"robo_pipe.device.{name}.at"].endswith("Z")
        assert tags["robo_pipe.device.ghost.state"] == "unreachable"
        shown = cli("models", "show", f"{MODEL}/1", "--all", home=shared_home)
        assert shown.returncode == 0, shown.stderr
        # grouped: one row per device under "runs on"; --all adds the raw tags
        arm_b = next(line for line in shown.stdout.splitlines() if "  arm-b " in line)
        assert f"active {MODEL}:1 at" in arm_b and "p99" in arm_b, shown.stdout
        assert "runs on" in shown.stdout and "device.arm-b.state" in shown.stdout

        tasks = task_states(result["flow_run_id"])
        assert sorted(tasks) == [*names, "ghost"]
        assert all(tasks[name][0] == "COMPLETED" for name in names), tasks
        assert tasks["ghost"][0] == "FAILED" and "unreachable" in tasks["ghost"][1], tasks
        assert flow_state(result["flow_run_id"]) == "FAILED", "not every device runs it"
        from prefect.client.orchestration import get_client

        with get_client(sync_client=True) as prefect:
            artifacts = [
                a for a in prefect.read_artifacts() if str(a.flow_run_id) == result["flow_run_id"]
            ]
        assert [a.key for a in artifacts] == [f"fleet-{MODEL}"]
        assert "| arm-b |" in str(artifacts[0].data) and "unreachable" in str(artifacts[0].data)

        status = cli("fleet", "status", "--fleet", str(fleet), "--json", home=shared_home)
        assert status.returncode == 1, status.stderr[-3000:]
        assert "unreachable: ghost" in status.stderr
        states = {s["device"]: s for s in json.loads(status.stdout.strip().splitlines()[-1])}
        for name in names:
            s = states[name]
            assert s["reachable"] and s["active"] == f"{MODEL}:1" and s["staged"] is None
            assert s["gate"].startswith("passed") and s["last_state"] == "active"
            assert s["locked"] is False
        assert not states["ghost"]["reachable"] and states["ghost"]["error"]
    finally:
        stop_fleet(agents)


def test_a_failing_canary_stops_the_rollout_and_no_other_device_changes(
    registered: str, signing: Path, shared_home: Path, tmp_path: Path
) -> None:
    names = ["slow-arm", "arm-d", "arm-e"]
    agents = start_fleet(shared_home, tmp_path, names, failing=("slow-arm",))
    try:
        put_on_v1(shared_home, signing, agents, ["arm-d", "arm-e"])
        fleet = write_fleet(tmp_path / "fleet.yaml", agents, names, {"waves": [1]})
        done = rollout(fleet, shared_home, signing, "--canary", "1")
        assert done.returncode == 1, done.stderr[-3000:]
        result = record(done)
        by_device = rows(result)
        assert (
            result["stopped_at_wave"] == 0
            and "canary: 1 of 1 failed (slow-arm)" in (result["reason"])
        )
        canary = by_device["slow-arm"]
        assert canary["state"] == "refused" and "gate" in canary["reason"], canary
        assert "budget" in canary["reason"] and canary["after"] is None
        for name in ("arm-d", "arm-e"):
            assert by_device[name]["state"] == "skipped"
            assert active(agents[name]) == f"{MODEL}:1", "no other device changed"
        assert active(agents["slow-arm"]) is None
        assert "rollout stopped" in done.stderr and "canary" in done.stderr
        assert "were rolled back" not in done.stderr, "no device was updated"
        assert "nothing to roll back" in done.stderr
        states = task_states(result["flow_run_id"])
        assert list(states) == ["slow-arm"], "only the canary was deployed"
        assert states["slow-arm"][0] == "FAILED" and "refused" in states["slow-arm"][1]
        assert flow_state(result["flow_run_id"]) == "FAILED"
    finally:
        stop_fleet(agents)


def test_a_failing_wave_stops_and_rolls_back_the_devices_updated_before_it(
    registered: str, signing: Path, shared_home: Path, tmp_path: Path
) -> None:
    """Canary arm-f passes; the next wave deploys arm-g and slow-arm at once, slow-arm fails
    its gate, so with --max-failures 0 arm-f and arm-g go back to v1; arm-h never starts."""
    from pipelines.registry.versions import get_version

    names = ["arm-f", "arm-g", "slow-arm", "arm-h"]
    agents = start_fleet(shared_home, tmp_path, names, failing=("slow-arm",))
    try:
        put_on_v1(shared_home, signing, agents, ["arm-f", "arm-g", "arm-h"])
        policy = {"canary": 1, "waves": [2, 1], "max_failures": 3}
        fleet = write_fleet(tmp_path / "fleet.yaml", agents, names, policy)
        done = rollout(fleet, shared_home, signing, "--max-failures", "0")
        assert done.returncode == 1, done.stderr[-3000:]
        result = record(done)
        by_device = rows(result)
        assert (
            result["stopped_at_wave"] == 1
            and "wave 1: 1 of 2 failed (slow-arm)" in (result["reason"])
        )
        for name in ("arm-f", "arm-g"):
            row = by_device[name]
            assert row["state"] == "reverted" and row["before"] == row["after"] == f"{MODEL}:1"
            assert row["p99_ms"] > 0 and "rolled back" in row["reason"]
            assert active(agents[name]) == f"{MODEL}:1"
        assert by_device["slow-arm"]["state"] == "refused"
        assert by_device["arm-h"]["state"] == "skipped" and active(agents["arm-h"]) == f"{MODEL}:1"
        assert "rollout stopped" in done.stderr and "reverted" in done.stderr
        tags = get_version(MODEL, "2").tags
        assert tags["robo_pipe.device.arm-f.state"] == "reverted"
        assert tags["robo_pipe.device.arm-f.version"] == f"{MODEL}:1"
        assert tags["robo_pipe.device.slow-arm.state"] == "refused"
        assert "robo_pipe.device.arm-h.state" not in tags, "a device never reached: no tag"
        assert "were rolled back (arm-f, arm-g)" in done.stderr
        states = task_states(result["flow_run_id"])
        assert {name: state for name, (state, _) in states.items()} == {
            "arm-f": "FAILED",
            "arm-g": "FAILED",
            "slow-arm": "FAILED",
        }, "a reverted device's task run is Failed too"
        assert "rolled back" in states["arm-f"][1]
        assert flow_state(result["flow_run_id"]) == "FAILED"
    finally:
        stop_fleet(agents)


def test_an_unreachable_canary_is_a_failure_that_stops_the_rollout(
    registered: str, signing: Path, shared_home: Path, tmp_path: Path, idle_fleet: Any
) -> None:
    before = {name: active(agent) for name, agent in idle_fleet.items()}
    fleet = write_fleet(
        tmp_path / "fleet.yaml", idle_fleet, ["ghost", "idle-a", "idle-b"], ghost="ghost"
    )
    done = rollout(fleet, shared_home, signing, "--canary", "1", "--max-failures", "5")
    assert done.returncode == 1, done.stderr[-3000:]
    result = record(done)
    by_device = rows(result)
    assert result["stopped_at_wave"] == 0 and "(ghost)" in result["reason"]
    assert by_device["ghost"]["state"] == "unreachable" and by_device["ghost"]["reason"]
    assert {by_device[n]["state"] for n in idle_fleet} == {"skipped"}
    assert {name: active(agent) for name, agent in idle_fleet.items()} == before


def test_a_dry_run_prints_the_plan_and_changes_nothing(
    registered: str, signing: Path, shared_home: Path, tmp_path: Path, idle_fleet: Any
) -> None:
    from tests.pipelines.test_deploy import status

    before = {name: status(agent) for name, agent in idle_fleet.items()}
    fleet = write_fleet(
        tmp_path / "fleet.yaml",
        idle_fleet,
        ["idle-a", "idle-b", "ghost"],
        {"canary": 1, "waves": ["50%"]},
        ghost="ghost",
    )
    done = rollout(fleet, shared_home, signing, "--dry-run")
    assert done.returncode == 0, done.stderr[-3000:]
    result = record(done)
    assert result["dry_run"] and result["waves"] == [["idle-a"], ["idle-b", "ghost"]]
    assert {r["state"] for r in result["devices"]} == {"planned"}
    assert rows(result)["ghost"]["reason"], "an unreachable device says why"
    assert "plan:" in done.stderr and "(canary)" in done.stderr
    assert {name: status(agent) for name, agent in idle_fleet.items()} == before
    selected = rollout(fleet, shared_home, signing, "--dry-run", "--select", "site=plant")
    assert selected.returncode == 0 and [r["device"] for r in record(selected)["devices"]] == [
        "idle-b"
    ]


def test_bad_input_is_refused_before_any_work(
    registered: str, shared_home: Path, tmp_path: Path
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(
        yaml.safe_dump(
            {
                "devices": [{"name": "a", "url": "http://127.0.0.1:1", "token_env": TOKEN_ENV}],
                "rollout": {"waves": ["ten"]},
            }
        )
    )
    uri = f"models:/{MODEL}/1"
    both = cli("deploy", uri, "--fleet", str(fleet), "--device", "a", home=shared_home)
    assert both.returncode == 2 and "either --device" in both.stderr
    neither = cli("deploy", uri, home=shared_home)
    assert neither.returncode == 2 and "either --device" in neither.stderr
    stray = cli("deploy", uri, "--device", "a", "--canary", "1", home=shared_home)
    assert stray.returncode == 2 and "--canary only apply with --fleet" in stray.stderr
    invalid = cli("deploy", uri, "--fleet", str(fleet), home=shared_home)
    assert invalid.returncode == 2 and "field 'rollout.waves'" in invalid.stderr
    assert str(fleet) in invalid.stderr and "Traceback" not in invalid.stderr
    status = cli("fleet", "status", "--fleet", str(fleet), home=shared_home)
    assert status.returncode == 2 and "'ten'" in status.stderr


def test_a_pipeline_whose_config_names_a_fleet_rolls_its_new_champion_out(
    shared_home: Path, tmp_path: Path
) -> None:
    """``deploy.fleet`` (what a nightly retrain's config sets): the pipeline promotes a
    champion, then rolls it out to the fleet, signed with the home's key."""
    from pipelines.deploy.release import signing_key
    from pipelines.run.flow import train_simulate_deploy
    from tests.pipelines.test_flow import CONFIG, TINY

    public = signing_key().with_suffix(".pub")
    names = ["night-a", "night-b"]
    root = tmp_path / "agents"
    root.mkdir()
    agents = {}
    try:
        for name in names:
            folder = root / name
            folder.mkdir()
            agents[name] = start_agent(
                shared_home,
                folder,
                name=name,
                target=str(target(folder, fails=False)),
                trusted_keys=[str(public)],
                **AGENT,
            )
        fleet = write_fleet(tmp_path / "fleet.yaml", agents, names, {"canary": 1})
        os.environ[TOKEN_ENV] = TOKEN
        result = train_simulate_deploy(
            config=CONFIG,
            overrides=[
                *TINY,
                "registry.model_name=nightly-policy",
                "deploy.local_agent=false",
                f"deploy.fleet={fleet}",
            ],
        )
        assert result.promoted and result.rollout is not None, result
        assert result.rollout.complete, result.rollout
        assert {row.device: row.after for row in result.rollout.devices} == {
            name: f"nightly-policy:{result.version}" for name in names
        }
        assert {name: active(agents[name]) for name in names} == {
            name: f"nightly-policy:{result.version}" for name in names
        }
    finally:
        stop_fleet(agents)


def started_rollout(fleet: Path, home: Path, key: Path, *extra: str) -> subprocess.Popen[str]:
    """``deploy --fleet`` of v2 in its own session (a terminal's foreground group: a signal to
    the group reaches every process of the command), SIGINT at its default as in a terminal."""
    from prefect.settings import PREFECT_API_URL

    from tests.pipelines.test_flow import ROOT

    env = {
        **os.environ,
        "ROBO_PIPE_HOME": str(home),
        "COLUMNS": "200",
        "PREFECT_API_URL": str(PREFECT_API_URL.value()),
        TOKEN_ENV: TOKEN,
    }
    cmd = [sys.executable, "-m", "pipelines.cli", "deploy", f"models:/{MODEL}/2"]
    return subprocess.Popen(
        [*cmd, "--fleet", str(fleet), "--key", str(key), "--json", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def wait_for_row(home: Path, device: str, state: str, timeout_s: float = 120.0) -> dict[str, Any]:
    """The newest rollout record once ``device``'s row in it is in ``state``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        records = sorted((home / "rollouts").glob("*.json"))
        if records:
            data = json.loads(records[-1].read_text())
            if any(r["device"] == device and r["state"] == state for r in data["devices"]):
                return dict(data)
        time.sleep(0.1)
    raise AssertionError(f"{device} never reached {state}")


def history(agent: dict[str, Any]) -> list[dict[str, Any]]:
    import httpx

    answer = httpx.get(
        f"http://127.0.0.1:{agent['port']}/history", headers={"Authorization": f"Bearer {TOKEN}"}
    )
    answer.raise_for_status()
    return list(answer.json())


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_signal_mid_wave_stops_launching_rolls_back_and_exits_128_plus_it(
    stop: signal.Signals, registered: str, signing: Path, shared_home: Path, tmp_path: Path
) -> None:
    """The canary arm-p and arm-q take v2; a stop signal while slow-q (a paced gate) is still
    in flight -- Ctrl-C's SIGINT to the command's group, or SIGTERM to its process only, as
    ``kill``, systemd or a scheduler sends it: arm-r's wave never starts, slow-q ends on its
    own, arm-p and arm-q go back to v1 (the agents' history names the rollout), the table and
    one line are printed, stdout is the JSON document alone, exit 130 / 143, the flow run is
    Cancelled and the reverted devices' task runs Failed."""
    names = ["arm-p", "arm-q", "arm-r"]
    agents = start_fleet(shared_home, tmp_path, names)
    folder = tmp_path / "slow-q"
    folder.mkdir()
    slow = target(folder, fails=True)  # refused after its paced gate: never updated
    agents["slow-q"] = start_agent(
        shared_home, folder, name="slow-q", target=str(slow), **{**AGENT, "gate_steps": 40},
        pace=True,
    )  # fmt: skip
    try:
        put_on_v1(shared_home, signing, agents, ["arm-p", "arm-q"])
        policy = {"canary": 1, "waves": [2, 1], "max_failures": 5}
        fleet = write_fleet(
            tmp_path / "fleet.yaml", agents, ["arm-p", "arm-q", "slow-q", "arm-r"], policy
        )
        proc = started_rollout(fleet, shared_home, signing)
        try:
            found = wait_for_row(shared_home, "arm-q", "active")
            assert any(
                r["device"] == "slow-q" and r["state"] == "deploying" for r in found["devices"]
            )
            if stop == signal.SIGINT:
                os.killpg(proc.pid, stop)  # Ctrl-C: the whole foreground group
            else:
                os.kill(proc.pid, stop)  # kill: the command's process only
            out, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        assert proc.returncode == 128 + stop, err[-3000:]
        result = json.loads(out)  # stdout is one JSON document, nothing else
        assert result["cancelled_by"] == stop.name and result["stopped_at_wave"] is None
        by_device = rows(result)
        for name in ("arm-p", "arm-q"):
            assert by_device[name]["state"] == "reverted", by_device[name]
            assert active(agents[name]) == f"{MODEL}:1"
            last = history(agents[name])[0]  # newest first
            assert last["state"] == "rolled_back", last
            assert last["origin"]["rollout"] == result["rollout_id"]
            assert last["origin"]["by"] == "fleet"
            # its rollback target is never the version the fleet just left (v2)
            assert agent_status(agents[name])["previous"] is None
            deployed = next(d for d in history(agents[name]) if d["model_version"] == "2")
            assert deployed["origin"]["rollout"] == result["rollout_id"], "the deployment too"
        assert by_device["slow-q"]["state"] == "refused" and active(agents["slow-q"]) is None
        assert by_device["arm-r"]["state"] == "skipped" and active(agents["arm-r"]) is None
        assert "cancelled" in by_device["arm-r"]["reason"]
        assert "Traceback" not in err and "reverted" in err, "the table is printed"
        line = [x for x in err.splitlines() if "cancelled by" in x and stop.name in x]
        assert len(line) == 1 and "were rolled back (arm-p, arm-q)" in line[0], err[-2000:]
        assert flow_state(result["flow_run_id"]) == "CANCELLED"
        states = task_states(result["flow_run_id"])
        assert {name: state for name, (state, _) in states.items()} == {
            "arm-p": "FAILED",
            "arm-q": "FAILED",
            "slow-q": "FAILED",
        }
        record = json.loads((shared_home / "rollouts" / f"{result['rollout_id']}.json").read_text())
        assert record["state"] == "cancelled"
    finally:
        stop_fleet(agents)


def descendants(pid: int) -> list[str]:
    """The command lines of the processes under ``pid`` now (read from /proc)."""
    parent_of, cmdline = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
            command = (stat.parent / "cmdline").read_bytes()
        except OSError:  # it ended meanwhile
            continue
        child = int(stat.parent.name)
        parent_of[child] = int(fields[1])
        cmdline[child] = command.replace(b"\0", b" ").decode(errors="replace")
    under, found = {pid}, True
    while found:
        found = False
        for child, parent in parent_of.items():
            if parent in under and child not in under:
                under.add(child)
                found = True
    return [cmdline[p] for p in under - {pid}]


def status_without_prefect(fleet: Path, home: Path) -> subprocess.CompletedProcess[str]:
    """``fleet status --json`` with no Prefect server configured, watched while it runs: no
    process under it may be a Prefect server, nor its stderr Prefect's log."""
    from tests.pipelines.test_flow import ROOT

    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env |= {"ROBO_PIPE_HOME": str(home), "COLUMNS": "200", TOKEN_ENV: TOKEN}
    cmd = [sys.executable, "-m", "pipelines.cli", "fleet", "status", "--fleet", str(fleet)]
    proc = subprocess.Popen(
        [*cmd, "--json"], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    servers: set[str] = set()
    with ThreadPoolExecutor(1) as pool:
        ended = pool.submit(proc.communicate, timeout=300)
        while not ended.done():  # a temporary Prefect server lives 10 s and more
            lines = descendants(proc.pid)
            servers |= {line for line in lines if "prefect" in line.lower()}
            time.sleep(0.2)
        out, err = ended.result()
    assert not servers, f"a Prefect server was started: {servers}"
    assert "INFO" not in err and "temporary server" not in err.lower(), err[-2000:]
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_a_killed_rollout_is_reconciled_by_the_next_fleet_command(
    registered: str, signing: Path, shared_home: Path, tmp_path: Path
) -> None:
    """SIGKILL during the pause after the canary (arm-s on v2, arm-t not started): the record
    says running. A first `fleet status` with arm-s's agent down says, in one line for arm-s,
    that it is not repaired yet, and leaves the record running; a second, with the agent back,
    rolls arm-s back to v1 (one line), tags v2 ``reverted`` there and marks the record
    reconciled, which keeps both passes' lines. Neither starts a Prefect server (none is
    configured: repairing talks to the agents). Then its exit codes: 0 when every device
    answers and runs the expected version, 1 when one does not or is unreachable."""
    from pipelines.registry.versions import get_version
    from tests.pipelines.test_fleet_ops import restart

    names = ["arm-s", "arm-t"]
    agents = start_fleet(shared_home, tmp_path, names)
    try:
        put_on_v1(shared_home, signing, agents, names)
        policy = {"canary": 1, "waves": [1], "pause_s": 60}
        fleet = write_fleet(tmp_path / "fleet.yaml", agents, names, policy)
        proc = started_rollout(fleet, shared_home, signing)
        try:
            found = wait_for_row(shared_home, "arm-s", "active")
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate(timeout=30)
        assert active(agents["arm-s"]) == f"{MODEL}:2", "the canary took v2 before the kill"
        record_file = shared_home / "rollouts" / f"{found['id']}.json"
        assert json.loads(record_file.read_text())["state"] == "running"

        agents["arm-s"]["process"].terminate()
        agents["arm-s"]["process"].wait(timeout=20)
        first = status_without_prefect(fleet, shared_home)
        assert first.returncode == 1 and "unreachable: arm-s" in first.stderr, first.stderr
        said = [x for x in first.stderr.splitlines() if "arm-s" in x and found["id"] in x]
        assert len(said) == 1 and said[0].startswith("not repaired yet: "), first.stderr
        record = json.loads(record_file.read_text())
        assert record["state"] == "running" and len(record["repaired"]) == 1, record

        restart(agents["arm-s"], tmp_path / "arm-s", shared_home)
        status = status_without_prefect(fleet, shared_home)
        assert status.returncode == 0, status.stderr[-3000:]  # no completed rollout: answers
        said = [x for x in status.stderr.splitlines() if "arm-s" in x and found["id"] in x]
        assert len(said) == 1, status.stderr
        assert said[0].startswith(f"repaired rollout {found['id']}")
        assert f"arm-s rolled back from {MODEL}:2 to {MODEL}:1" in said[0]
        assert active(agents["arm-s"]) == f"{MODEL}:1"
        assert history(agents["arm-s"])[0]["origin"]["rollout"] == found["id"]
        tags = get_version(MODEL, "2").tags
        assert tags["robo_pipe.device.arm-s.state"] == "reverted"
        assert tags["robo_pipe.device.arm-s.version"] == f"{MODEL}:1"
        record = json.loads(record_file.read_text())
        assert record["state"] == "reconciled", record
        passes = record["repaired"]  # both passes, in order
        assert len(passes) == 2 and "not repaired yet: " in passes[0], passes
        assert "arm-s rolled back from" in passes[1], passes
        again = cli("fleet", "status", "--fleet", str(fleet), home=shared_home)
        assert again.returncode == 0 and "repaired" not in again.stderr, "repaired once"

        on_v1 = cli(
            "fleet", "status", "--fleet", str(fleet), "--expect", f"{MODEL}:1", home=shared_home
        )
        assert on_v1.returncode == 0, on_v1.stderr[-2000:]
        on_v2 = cli(
            "fleet", "status", "--fleet", str(fleet), "--expect", f"{MODEL}:2", home=shared_home
        )
        assert on_v2.returncode == 1 and f"not on {MODEL}:2: arm-s" in on_v2.stderr
        ghost = write_fleet(tmp_path / "ghost.yaml", agents, [*names, "ghost"], ghost="ghost")
        down = cli("fleet", "status", "--fleet", str(ghost), home=shared_home)
        assert down.returncode == 1 and "unreachable: ghost" in down.stderr
        bad = cli("fleet", "status", "--fleet", str(fleet), "--expect", "v2", home=shared_home)
        assert bad.returncode == 2 and "MODEL:VERSION" in bad.stderr
    finally:
        stop_fleet(agents)
