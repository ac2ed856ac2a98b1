"""Served schedules after a fault, through ``robo-pipe serve`` in subprocesses.

One home for the module, with a champion (one tiny ``robo-pipe run``), serving a champion check
every :data:`PERIOD_S` seconds:

1. ``serve``'s process group is killed with SIGKILL while a check is being submitted, or
   while one runs (its flow process holds its run lock); the next ``serve`` marks that run
   ``Crashed`` with the reason, and a check completes within :data:`NEXT_RUN_BOUND_S`.
2. ``serve`` is killed while idle and stays down for several periods; the next ``serve``
   runs the latest missed check and marks the others ``Skipped`` with the reason: no storm of
   ``Cancelled`` runs. A slot counted taken by no run (a lease lost with its server) is
   given back while serving.
3. On a home with no champion every check fails: ``serve`` and ``robo-pipe info`` report the
   schedule stalled, with the reason.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.pipelines.test_flow import CONFIG
from tests.pipelines.test_serve import ROOT, SETS, Cli, _kill_all, cli_env

PERIOD_S = 10
CHECK = f"schedules=[{{name: check, flow: champion_regression, interval_s: {PERIOD_S}}}]"
NEXT_RUN_BOUND_S = 120
"""From the second ``serve``'s start to a completed check: a bound on hanging (its servers'
start, then one check); the measured figure is printed."""


@pytest.fixture
def home_path(shared_home: Path) -> Path:
    return shared_home


@pytest.fixture(scope="module")
def champion(shared_home: Path) -> Path:
    """The module's home with a champion: one tiny ``robo-pipe run`` (about 50 s)."""
    cmd = [sys.executable, "-m", "pipelines.cli", "run", "-c", CONFIG, *SETS]
    done = subprocess.run(
        cmd, cwd=ROOT, env=cli_env(shared_home), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return shared_home


def serve(home: Path) -> Cli:
    """``robo-pipe serve`` of the check schedule on ``home``, its own servers started."""
    return Cli(["serve", "-c", CONFIG, *SETS, "--set", CHECK], home)


@contextlib.contextmanager
def prefect(api: str) -> Iterator[Any]:
    """A Prefect client of ``api`` in this process."""
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        yield client


def wait_for(what: str, check: Any, cli: Cli, timeout_s: float, every: float = 0.5) -> Any:
    """``check()`` once truthy; fails (stopping ``cli``) if ``cli`` exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        assert cli.alive(), f"serve exited before {what}: {cli.output()[-3000:]}"
        time.sleep(every)
    pytest.fail(f"timed out waiting for {what}; serve said:\n{cli.stop()[-3000:]}")


def api_of(cli: Cli) -> str:
    """The Prefect API of the servers ``cli`` (a ``serve``) started."""
    state = cli.home / "services.json"

    def written_by_cli() -> dict[str, Any] | None:
        # Not the one a killed serve left behind.
        with contextlib.suppress(FileNotFoundError, json.JSONDecodeError):
            found: dict[str, Any] = json.loads(state.read_text())
            return found if found.get("pid") == cli.proc.pid else None
        return None

    api: str = wait_for("serve's servers", written_by_cli, cli, 180)["prefect_api_url"]
    return api


def check_runs(client: Any) -> list[Any]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterName

    return list(
        client.read_flow_runs(
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["check"])),
            limit=200,
        )
    )


def kill_group(cli: Cli) -> None:
    """SIGKILL ``cli``'s process group (serve, its runner, its flow processes), as a power cut
    of its session would."""
    os.killpg(cli.proc.pid, signal.SIGKILL)
    cli.proc.wait()


def completed_after(client: Any, since: datetime, but: set[Any]) -> list[Any]:
    return [
        r
        for r in check_runs(client)
        if r.id not in but and r.state and r.state.is_completed() and r.state.timestamp > since
    ]


@pytest.mark.parametrize("moment", ["Submitting", "Running"])
def test_a_run_stranded_by_a_killed_serve_is_crashed_and_the_next_check_runs(
    moment: str, champion: Path
) -> None:
    first = serve(champion)
    try:
        api = api_of(first)
        active = champion / "runs" / ".active"

        def caught() -> Any:
            with prefect(api) as client:
                for run in check_runs(client):
                    state = run.state
                    if moment == "Submitting" and state and state.type.value == "PENDING":
                        return run
                    # Mid-run: its flow process runs the flow body (it holds its run lock).
                    running = moment == "Running" and state and state.is_running()
                    if running and (active / f"{run.id}.json").is_file():
                        return run
            return None

        stranded = wait_for(f"a check {moment}", caught, first, 180, every=0.1)
        kill_group(first)
    finally:
        if first.alive():
            kill_group(first)
    killed_at = datetime.now(UTC)

    second = serve(champion)
    start = time.monotonic()
    try:
        api = api_of(second)
        with prefect(api) as client:

            def crashed() -> Any:
                state = client.read_flow_run(stranded.id).state
                return state if state and state.type.value == "CRASHED" else None

            state = wait_for("the stranded run Crashed", crashed, second, 120)
            crashed_in = time.monotonic() - start
            done = wait_for(
                "a check completed",
                lambda: completed_after(client, killed_at, {stranded.id}),
                second,
                NEXT_RUN_BOUND_S,
            )
            completed_in = time.monotonic() - start
            history = sorted(client.read_flow_run_states(stranded.id), key=lambda s: s.timestamp)
    finally:
        output = second.stop()
        _kill_all(champion)
    print(
        f"killed while {stranded.state.name}: Crashed {crashed_in:.1f} s and a check "
        f"({done[0].name}) Completed {completed_in:.1f} s after serve started again"
    )
    before = history[-2]
    assert before.type.value == ("PENDING" if moment == "Submitting" else "RUNNING"), history
    assert "with no live runner" in (state.message or ""), state
    if moment == "Submitting":
        assert "no runner was submitting it when serve started" in state.message
    else:
        assert "ended without reporting" in state.message, state.message
    assert f"run {stranded.name} marked Crashed" in output, output[-3000:]
    assert completed_in < NEXT_RUN_BOUND_S


def test_downtime_runs_the_latest_missed_check_and_skips_the_others(champion: Path) -> None:
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    first = serve(champion)
    try:
        api = api_of(first)
        started = datetime.now(UTC)

        def idle_after_a_check() -> bool:
            with prefect(api) as client:
                runs = check_runs(client)
            done = [r for r in runs if r.state and r.state.is_completed()]
            busy = [r for r in runs if r.state and r.state.type.value in ("PENDING", "RUNNING")]
            return not busy and any(r.state.timestamp > started for r in done)

        wait_for("a completed check, then none running", idle_after_a_check, first, 180, 0.2)
        kill_group(first)
    finally:
        if first.alive():
            kill_group(first)
    down_from = datetime.now(UTC)
    _kill_all(champion)  # its servers too, whether or not they die with their parent
    time.sleep(4 * PERIOD_S)

    second = serve(champion)
    start = time.monotonic()
    try:
        api = api_of(second)
        with prefect(api) as client:
            [deployment] = [d for d in client.read_deployments() if d.name == "check"]

            def latest_done() -> list[Any]:
                return completed_after(client, down_from, set())

            wait_for("the latest missed check", latest_done, second, NEXT_RUN_BOUND_S)
            completed_in = time.monotonic() - start
            runs = check_runs(client)
            # A slot counted taken by no run, as when a server restarts with its leases in
            # memory: a pass while serving gives it back.
            wait_for("no check running", lambda: not holding(client), second, 60, 0.2)
            limit = deployment.global_concurrency_limit.name
            client.update_global_concurrency_limit(
                limit, GlobalConcurrencyLimitUpdate(active_slots=1)
            )
            lost_at = datetime.now(UTC)
            freed = wait_for(
                "a check after the lost slot",
                lambda: completed_after(client, lost_at, set()),
                second,
                60,
            )
            freed_in = (freed[0].state.timestamp - lost_at).total_seconds()
    finally:
        output = second.stop()
        _kill_all(champion)
    # Due after the kill, and not settled before it (the runner submits a run up to 10 s
    # before it is due: one that would overlap a running check was Cancelled while serving).
    due = [
        r
        for r in runs
        if r.expected_start_time
        and r.expected_start_time > down_from
        and r.state
        and r.state.timestamp > down_from
    ]
    skipped = [r for r in due if r.state and r.state.name == "Skipped"]
    assert len(skipped) >= 3, [(r.name, r.state.name) for r in due]
    message = skipped[0].state.message
    # By id: a check is renamed after its outcome once it ends.
    [kept] = [r for r in runs if str(r.id) in message]
    assert all("only the latest missed run, " in r.state.message for r in skipped)
    assert all(str(kept.id) in r.state.message for r in skipped), "one run ran"
    missed = [r for r in due if r.expected_start_time <= kept.expected_start_time]
    print(
        f"{len(missed)} checks missed while serve was down: {len(skipped)} Skipped, "
        f"{kept.name} {kept.state.name}; it Completed {completed_in:.1f} s after serve started "
        f"again; a slot counted taken by no run was given back and a check completed "
        f"{freed_in:.1f} s later"
    )
    assert kept.state.is_completed(), kept.state
    others = [r for r in missed if r.id != kept.id]
    assert all(r.state.name == "Skipped" for r in others), [
        (r.name, r.state.name, r.state.message) for r in missed
    ]
    assert all("missed while no robo-pipe serve ran" in r.state.message for r in others)
    assert "downtime policy: runs missed while no serve ran" in output, output[-3000:]
    assert " missed runs: " in output and " marked Skipped" in output, output[-3000:]


def holding(client: Any) -> list[Any]:
    """The checks that hold the slot (Pending, Submitting, Running)."""
    return [
        r for r in check_runs(client) if r.state and r.state.type.value in ("PENDING", "RUNNING")
    ]


def test_a_stalled_schedule_is_reported_by_serve_and_info(tmp_path: Path) -> None:
    home = tmp_path / "no-champion"
    home.mkdir()
    cli = serve(home)  # no champion: every check fails
    try:
        api_of(cli)
        start = time.monotonic()
        wait_for("serve to report the stall", lambda: "runs Failed" in cli.output(), cli, 120)
        reported_in = time.monotonic() - start
        info = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "info", "--json"],
            cwd=ROOT,
            env=cli_env(home),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        output = cli.stop()
        _kill_all(home)
    print(f"stall reported {reported_in:.1f} s after serve's servers answered")
    line = next(x for x in output.splitlines() if "runs Failed" in x)
    assert line.startswith("champion_regression/check (every 10 s): ") and "STALLED" in line, line
    assert info.returncode == 0, info.stderr[-3000:]
    [schedule] = json.loads(info.stdout.strip().splitlines()[-1])["schedules"]
    assert schedule["deployment"] == "champion_regression/check"
    # A moment later than serve's line: its last run may be another one by now.
    assert schedule["stalled"].startswith("no completed run since"), schedule
    assert schedule["last_run"] and schedule["next_at"], schedule
