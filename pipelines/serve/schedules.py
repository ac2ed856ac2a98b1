"""Served schedules that keep running after a fault: stranded runs and downtime.

A deployment served by ``robo-pipe serve`` runs one flow run at a time: Prefect keeps a
one-slot concurrency limit (``deployment:<id>``) whose count lives in its database, while the
lease that would free it lives in the server's memory. A runner or server that dies mid-run
leaves the run ``Submitting``/``Pending``/``Running`` and the slot taken for good, and every
later run of the schedule is refused (``Cancelled``: "Deployment concurrency limit reached").
This module, called by :func:`pipelines.serve.deployments.serve`:

- :func:`release_stranded` (at ``serve`` start, before the runner polls, and every
  :data:`PASS_EVERY_S` while it serves) marks ``Crashed``, with the reason, each run of the
  served deployments that no live process is executing, then sets each limit's count to the
  runs that do hold it. A run is alive when it is in this runner's hands (submitting or in one
  of its processes) or when its flow process holds its run lock
  (``runs/.active/<id>.json``, see :mod:`pipelines.run.reconcile`); at ``serve`` start nothing of
  its deployments can legitimately be ``Pending``.
- :func:`skip_missed` applies :data:`DOWNTIME_POLICY` to the scheduled runs whose time passed
  while nothing served them.
- :func:`at_serve_start` and :func:`keep_watch` do both and tell each schedule's health
  (:func:`pipelines.serve.schedule_health.schedule_health`: its last run, its state, the next
  run, and whether it is stalled, with the reason).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pipelines.home import home_path
from pipelines.run.reconcile import ACTIVE_DIR
from pipelines.serve.schedule_health import (
    deployment_label,
    hms,
    runs_of,
    schedule_health,
    sync_client,
    utc_now,
)

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun

DOWNTIME_POLICY = (
    "runs missed while no serve ran: the latest one runs now, the others are marked Skipped"
)
"""What :func:`skip_missed` does, as ``serve`` prints it (and docs/pipeline.md states it)."""

PASS_EVERY_S = 15.0
"""How often a serving ``serve`` looks for stranded runs and reports a change in health."""

LOCK_GRACE_S = 30.0
"""A ``Running`` run without its run lock is stranded only after this long in that state: its
flow process takes a few seconds between ``Running`` and taking the lock."""

SUBMIT_GRACE_S = 30.0
"""While serving, a ``Pending`` run the runner does not hold is stranded after this long."""


@dataclass(frozen=True)
class Stranded:
    """A run :func:`release_stranded` marked ``Crashed``."""

    deployment: str
    run_name: str
    state: str
    """Its state name when found (``Submitting``, ``Running``...)."""
    reason: str


def _lock_says(run_id: UUID) -> str | None:
    """None while a process holds the run lock of ``run_id``; else why it is not running."""
    path = home_path("runs") / ACTIVE_DIR / f"{run_id}.json"
    try:
        handle = path.open()
    except FileNotFoundError:
        return "no process took its run lock"
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return None
    return f"its process ended without reporting (run lock runs/{ACTIVE_DIR}/{path.name} free)"


def release_stranded(
    deployment_ids: list[UUID], in_flight: Callable[[], set[UUID]] | None = None
) -> list[Stranded]:
    """Crash the runs of ``deployment_ids`` that nobody executes and give their slots back.

    ``in_flight``: the runs this serve's runner is submitting or running; None at ``serve``
    start, before the runner polls, when every ``Pending`` run is stranded.
    """
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    holding = [StateType.PENDING, StateType.RUNNING, StateType.CANCELLING]
    who = f"robo-pipe serve pid {os.getpid()}"
    found: list[Stranded] = []
    with sync_client() as client:
        names = {d: client.read_deployment(d) for d in deployment_ids}
        mine = set() if in_flight is None else in_flight()
        for run in runs_of(client, deployment_ids, holding):
            state = run.state
            if state is None or run.id in mine:
                continue
            age = (utc_now() - state.timestamp).total_seconds()
            reason: str | None
            if state.type == StateType.PENDING:
                if in_flight is None:
                    reason = "no runner was submitting it when serve started (its runner died)"
                else:
                    late = age > SUBMIT_GRACE_S
                    reason = f"no runner has been submitting it for {age:.0f} s" if late else None
            else:
                reason = _lock_says(run.id)
                if reason and reason.startswith("no process") and age < LOCK_GRACE_S:
                    reason = None  # its process may still be starting
            if reason is None:
                continue
            message = f"{state.name} with no live runner: {reason}; found by {who}"
            client.set_flow_run_state(run.id, Crashed(message=message), force=True)
            deployment = names[run.deployment_id] if run.deployment_id else None
            label = deployment_label(deployment) if deployment else "?"
            found.append(Stranded(label, run.name, str(state.name), message))
        # The crashes gave back the slots of runs that still had a lease; a slot whose lease
        # the server lost (it restarted) is given back here, down to the runs that hold one.
        # While serving, not while the runner has a submission the holders do not show yet
        # (between taking its slot and being read as Pending).
        holders = runs_of(client, deployment_ids, holding)
        if in_flight is not None and in_flight() - {r.id for r in holders}:
            return found
        for deployment_id, deployment in names.items():
            limit = deployment.global_concurrency_limit
            if limit is None:
                continue
            live = sum(1 for r in holders if r.deployment_id == deployment_id)
            current = client.read_global_concurrency_limit_by_name(limit.name)
            if current.active_slots > live:
                client.update_global_concurrency_limit(
                    limit.name, GlobalConcurrencyLimitUpdate(active_slots=live)
                )
    return found


def skip_missed(deployment_ids: list[UUID]) -> dict[str, Missed]:
    """Apply :data:`DOWNTIME_POLICY`: of the auto-scheduled runs whose time has passed, the
    latest stays scheduled (the runner runs it at once), the others become
    ``Cancelled(name="Skipped")`` with the reason. So do the runs due within
    :data:`OVERLAP_MARGIN_S` from now: the runner would fetch them together with the one that
    runs and submit them at once, and the deployment's one-slot limit would cancel whichever
    lost, the missed run too. Runs started from the UI or the API keep their place. Call it
    before the runner polls. Returns what it did, per deployment with missed runs."""
    from prefect.states import Cancelled

    now = utc_now()
    near = now + timedelta(seconds=OVERLAP_MARGIN_S)
    done: dict[str, Missed] = {}
    with sync_client() as client:
        for deployment_id in deployment_ids:
            runs = _auto_scheduled(client, deployment_id)
            if not any(r.expected_start_time and r.expected_start_time < now for r in runs):
                continue
            # Registering the deployment deleted its future runs; the server's scheduler makes
            # them again within seconds. Wait for them (bounded): those due soon must be seen.
            deadline = time.monotonic() + SCHEDULER_WAIT_S
            while time.monotonic() < deadline and not any(
                r.expected_start_time and r.expected_start_time > near for r in runs
            ):
                time.sleep(0.5)
                runs = _auto_scheduled(client, deployment_id)
            scheduled = [r for r in runs if r.expected_start_time and r.expected_start_time < near]
            scheduled.sort(key=lambda r: r.expected_start_time or now, reverse=True)
            missed = [r for r in scheduled if r.expected_start_time and r.expected_start_time < now]
            if not missed:
                continue
            keep = missed[0]
            close = [r for r in scheduled if r not in missed]
            for run in [*missed[1:], *close]:
                due = run.expected_start_time
                why = (
                    "missed while no robo-pipe serve ran"
                    if run in missed
                    else (f"due within {OVERLAP_MARGIN_S:g} s of the missed run that runs now")
                )
                client.set_flow_run_state(
                    run.id,
                    Cancelled(
                        name="Skipped",
                        message=f"{why} (due {hms(due)}); "
                        f"only the latest missed run, {keep.name} ({keep.id}), ran",
                    ),
                    force=True,
                )
            label = deployment_label(client.read_deployment(deployment_id))
            done[label] = Missed(len(missed), keep.name, len(close))
    return done


def _auto_scheduled(client: SyncPrefectClient, deployment_id: UUID) -> list[FlowRun]:
    from prefect.client.schemas.objects import StateType

    return [r for r in runs_of(client, [deployment_id], [StateType.SCHEDULED]) if r.auto_scheduled]


SCHEDULER_WAIT_S = 15.0
"""How long :func:`skip_missed` waits for the server's scheduler to make the upcoming runs."""


@dataclass(frozen=True)
class Missed:
    """What :func:`skip_missed` did to one deployment's runs."""

    count: int
    """Runs whose time passed while no serve ran."""
    kept: str
    """The latest of them, which runs now."""
    close: int
    """Runs due within :data:`OVERLAP_MARGIN_S`, Skipped too."""


OVERLAP_MARGIN_S = 20.0
"""Prefect's runner fetches the runs due within its prefetch (10 s) of each poll and submits
them at once; 10 s more for the runner to start polling after :func:`skip_missed`."""


def at_serve_start(deployment_ids: list[UUID], say: Callable[[str], None]) -> None:
    """What ``serve`` does once its deployments are registered, before its runner polls:
    release stranded runs, apply :data:`DOWNTIME_POLICY`, and tell each schedule's health."""
    for found in release_stranded(deployment_ids):
        say(f"{found.deployment}: run {found.run_name} marked Crashed ({found.reason})")
    missed = skip_missed(deployment_ids)
    say(f"downtime policy: {DOWNTIME_POLICY}")
    for deployment, m in missed.items():
        close = f" (and {m.close} due within {OVERLAP_MARGIN_S:g} s of it)" if m.close else ""
        say(
            f"{deployment}: {m.count} missed run{'s' if m.count > 1 else ''}: {m.kept} runs "
            f"now, {m.count - 1} marked Skipped{close}"
        )
    for health in schedule_health(deployment_ids, served_since=utc_now()):
        say(health.line())


def runner_in_flight(runner: Any) -> Callable[[], set[UUID]]:
    """The runs ``runner`` (a Prefect ``Runner``) is submitting or running now (its private
    attributes: Prefect 3.8 has no public way to them)."""

    def in_flight() -> set[UUID]:
        ids = set(runner._process_manager.flow_run_ids())
        poller = getattr(runner, "_scheduled_run_poller", None)
        return ids | set(getattr(poller, "_submitting_flow_run_ids", ()))

    return in_flight


async def keep_watch(
    deployment_ids: list[UUID], in_flight: Callable[[], set[UUID]], say: Callable[[str], None]
) -> None:
    """While ``serve`` serves: every :data:`PASS_EVERY_S`, release stranded runs and tell a
    schedule that became stalled or recovered. A pass the API does not answer is skipped
    (``serve``'s server watch says when the server is gone)."""
    import asyncio

    since = utc_now()
    stalled: dict[str, str | None] = {}  # what at_serve_start said: only changes are told
    with contextlib.suppress(Exception):
        health = await asyncio.to_thread(schedule_health, deployment_ids, since)
        stalled = {h.deployment: h.stalled for h in health}
    while True:
        await asyncio.sleep(PASS_EVERY_S)
        try:
            found = await asyncio.to_thread(release_stranded, deployment_ids, in_flight)
            health = await asyncio.to_thread(schedule_health, deployment_ids, since)
        except Exception:  # an API that does not answer: the next pass
            continue
        for run in found:
            say(f"{run.deployment}: run {run.run_name} marked Crashed ({run.reason})")
        for schedule in health:
            was = stalled.get(schedule.deployment, "")
            if schedule.stalled != was:  # stalled, why it is, or recovered: each change once
                say(
                    schedule.line()
                    if schedule.stalled or was == ""
                    else f"{schedule.line()} (recovered)"
                )
            stalled[schedule.deployment] = schedule.stalled
