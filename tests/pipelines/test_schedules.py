"""Served schedules after faults, through ``robo-pipe serve`` in subprocesses.

One home with a champion (one tiny ``robo-pipe run``), serving a champion check every
:data:`PERIOD_S` seconds, through four ``serve``s in a row, three of them killed with SIGKILL (its
process group, as a power cut of its session would):

1. The first is killed while a check is being submitted; the second while a check runs (its
   flow process holds its run lock). The next ``serve`` marks each such run ``Crashed`` with
   the reason, and a check completes within :data:`NEXT_RUN_BOUND_S`.
2. The third is killed idle and the home stays unserved for several periods. The fourth runs
   the latest missed check and marks the others ``Skipped`` with the reason: no storm of
   ``Cancelled`` runs. A slot counted taken by no run (a lease lost with its server) is given
   back while serving.
3. While the first home is down, ``serve`` on a second home, with no champion, where every
   check fails: ``serve`` and ``robo-pipe info`` report the schedule stalled, with the reason.
   (One scenario, not three tests: the stall fills the downtime, and each ``serve`` sets up
   the next fault; it saves two ``serve`` starts and a wait of four periods.)
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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.pipelines.test_flow import CONFIG
from tests.pipelines.test_serve import ROOT, SETS, Cli, _kill_all, cli_env

PERIOD_S = 10
CHECK = f"schedules=[{{name: check, flow: champion_regression, interval_s: {PERIOD_S}}}]"
PREFETCH_S = 10
"""Prefect's runner submits a run up to this long before it is due (its ``prefetch_seconds``)."""
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
    """The check's runs due by a minute from now, latest first (not its next hundred: a
    ``serve`` has its server schedule that many ahead, and each ``serve`` of a home adds
    theirs, so a plain first 200 could leave out the ones a test looks for)."""
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowRunFilter,
        FlowRunFilterExpectedStartTime,
    )
    from prefect.client.schemas.sorting import FlowRunSort

    soon = datetime.now(UTC) + timedelta(minutes=1)
    return list(
        client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                expected_start_time=FlowRunFilterExpectedStartTime(before_=soon)  # type: ignore[arg-type]
            ),
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=["check"])),
            sort=FlowRunSort.EXPECTED_START_TIME_DESC,
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


def test_serve_after_faults_crashes_stranded_runs_skips_missed_checks_and_reports_a_stall(
    champion: Path, tmp_path: Path
) -> None:
    first = serve(champion)
    try:
        stranded = strand(first, "Submitting")
    finally:
        if first.alive():
            kill_group(first)
    # Each next serve marks the run the last one stranded Crashed and completes a check; then it
    # is killed in turn: while a check runs, then idle.
    running = recovers(champion, stranded, "Submitting", then="Running")
    recovers(champion, running, "Running", then=None)
    down_from = datetime.now(UTC)

    phase = time.monotonic()
    stall_reported_on(tmp_path / "no-champion")  # meanwhile, on another home
    print(f"the stall phase took {time.monotonic() - phase:.1f} s")
    time.sleep(max(0.0, 4 * PERIOD_S - (datetime.now(UTC) - down_from).total_seconds()))

    last = serve(champion)
    try:
        with prefect(api_of(last)) as client:
            runs, completed_in, freed_in = latest_missed_check_ran(client, last, down_from)
    finally:
        output = last.stop()
        _kill_all(champion)
    assert_missed_checks_skipped(runs, down_from, output, completed_in, freed_in)


def recovers(home: Path, stranded: Any, moment: str, then: str | None) -> Any:
    """``serve`` again on ``home`` after one was killed with ``stranded`` at ``moment``: it
    marks that run Crashed with the reason and completes a check within
    :data:`NEXT_RUN_BOUND_S`. Then it is killed too, with a check at ``then`` (that check is
    returned), or idle (``None``)."""
    killed_at = datetime.now(UTC)
    cli = serve(home)
    start = time.monotonic()
    caught = None
    try:
        with prefect(api_of(cli)) as client:
            crashed, crashed_in = crashed_by(client, stranded, cli, start)
            done = wait_for(
                "a check completed",
                lambda: completed_after(client, killed_at, {stranded.id}),
                cli,
                NEXT_RUN_BOUND_S,
            )
            completed_in = time.monotonic() - start
            if then is None:
                wait_for("no check running", lambda: not holding(client), cli, 60, 0.2)
        if then is not None:
            caught = strand(cli, then)
    finally:
        if cli.alive():
            kill_group(cli)
        output = cli.output()
        _kill_all(home)  # its servers too, whether or not they die with their parent
    print(
        f"killed while {moment}: Crashed {crashed_in:.1f} s and a check ({done[0].name}) "
        f"Completed {completed_in:.1f} s after serve started again"
    )
    assert_crashed(crashed, moment, output)
    assert completed_in < NEXT_RUN_BOUND_S
    return caught


def strand(cli: Cli, moment: str) -> Any:
    """Kill ``cli`` (a ``serve``) once one of its checks is at ``moment`` (Submitting, or
    Running with its run lock held) and return that check's flow run."""
    api = api_of(cli)
    active = cli.home / "runs" / ".active"

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

    stranded = wait_for(f"a check {moment}", caught, cli, 180, every=0.1)
    kill_group(cli)
    return stranded


def crashed_by(client: Any, stranded: Any, cli: Cli, start: float) -> tuple[list[Any], float]:
    """The state history of ``stranded`` once ``cli`` (the next ``serve``) marked it Crashed,
    and the seconds from ``start`` until it did."""

    def crashed() -> Any:
        state = client.read_flow_run(stranded.id).state
        return state if state and state.type.value == "CRASHED" else None

    wait_for("the stranded run Crashed", crashed, cli, 120)
    crashed_in = time.monotonic() - start
    history = sorted(client.read_flow_run_states(stranded.id), key=lambda s: s.timestamp)
    return [stranded, *history], crashed_in


def assert_crashed(crashed: list[Any], moment: str, output: str) -> None:
    """The stranded run's history (as :func:`crashed_by` returns it) ends Crashed from
    ``moment``, with the reason, and the serve that marked it said so."""
    stranded, *history = crashed
    before, state = history[-2], history[-1]
    assert before.type.value == ("PENDING" if moment == "Submitting" else "RUNNING"), history
    assert state.type.value == "CRASHED", history
    assert "with no live runner" in (state.message or ""), state
    if moment == "Submitting":
        assert "no runner was submitting it when serve started" in state.message
    else:
        assert "ended without reporting" in state.message, state.message
    assert f"run {stranded.name} marked Crashed" in output, output[-3000:]


def latest_missed_check_ran(
    client: Any, cli: Cli, down_from: datetime
) -> tuple[list[Any], float, float]:
    """Wait for ``cli`` (a ``serve`` after downtime) to complete the latest missed check, then
    take a slot away as a lost lease would and wait for a check again: the checks after the
    first, and the seconds each took."""
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    start = time.monotonic()
    [deployment] = [d for d in client.read_deployments() if d.name == "check"]
    wait_for(
        "the latest missed check",
        lambda: completed_after(client, down_from, set()),
        cli,
        NEXT_RUN_BOUND_S,
    )
    completed_in = time.monotonic() - start
    runs = check_runs(client)
    # A slot counted taken by no run, as when a server restarts with its leases in memory: a
    # pass while serving gives it back.
    wait_for("no check running", lambda: not holding(client), cli, 60, 0.2)
    limit = deployment.global_concurrency_limit.name
    client.update_global_concurrency_limit(limit, GlobalConcurrencyLimitUpdate(active_slots=1))
    lost_at = datetime.now(UTC)
    freed = wait_for(
        "a check after the lost slot", lambda: completed_after(client, lost_at, set()), cli, 60
    )
    return runs, completed_in, (freed[0].state.timestamp - lost_at).total_seconds()


def assert_missed_checks_skipped(
    runs: list[Any], down_from: datetime, output: str, completed_in: float, freed_in: float
) -> None:
    """Of the checks due while no ``serve`` ran from ``down_from``, the latest completed and the
    others are Skipped with the reason."""
    # Due after the kill, beyond the killed runner's prefetch, and not settled before the kill:
    # the runner submits the runs due within PREFETCH_S of each poll, so one due just after
    # the kill may have been taken (a stranded run, marked Crashed, not missed), or Cancelled
    # while serving as it would overlap the running check.
    after = down_from + timedelta(seconds=PREFETCH_S)
    due = [
        r
        for r in runs
        if r.expected_start_time
        and r.expected_start_time > after
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
        (r.name, r.state.name, r.state.message, r.expected_start_time, down_from)
        for r in others
        if r.state.name != "Skipped"
    ]
    assert all("missed while no robo-pipe serve ran" in r.state.message for r in others)
    assert "downtime policy: runs missed while no serve ran" in output, output[-3000:]
    assert " missed runs: " in output and " marked Skipped" in output, output[-3000:]


def holding(client: Any) -> list[Any]:
    """The checks that hold the slot (Pending, Submitting, Running)."""
    return [
        r for r in check_runs(client) if r.state and r.state.type.value in ("PENDING", "RUNNING")
    ]


def stall_reported_on(home: Path) -> None:
    """``serve`` on ``home``, which has no champion: every check fails, and ``serve`` and
    ``robo-pipe info`` report the schedule stalled, with the reason."""
    home.mkdir()
    cli = serve(home)
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
