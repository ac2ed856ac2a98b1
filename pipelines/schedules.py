"""Served schedules that keep running after a fault: stranded runs, downtime, health.

A deployment served by ``robo-pipe serve`` runs one flow run at a time: Prefect keeps a
one-slot concurrency limit (``deployment:<id>``) whose count lives in its database, while the
lease that would free it lives in the server's memory. A runner or server that dies mid-run
leaves the run ``Submitting``/``Pending``/``Running`` and the slot taken for good, and every
later run of the schedule is refused (``Cancelled``: "Deployment concurrency limit reached").
This module, called by :func:`pipelines.deployments.serve`:

- :func:`release_stranded` (at ``serve`` start, before the runner polls, and every
  :data:`PASS_EVERY_S` while it serves) marks ``Crashed``, with the reason, each run of the
  served deployments that no live process is executing, then sets each limit's count to the
  runs that do hold it. A run is alive when it is in this runner's hands (submitting or in one
  of its processes) or when its flow process holds its run lock
  (``runs/.active/<id>.json``, see :mod:`pipelines.reconcile`); at ``serve`` start nothing of
  its deployments can legitimately be ``Pending``.
- :func:`skip_missed` applies :data:`DOWNTIME_POLICY` to the scheduled runs whose time passed
  while nothing served them.
- :func:`schedule_health` tells, per schedule, its last run, its state, the next run, and
  whether it is stalled (no completed run within two periods), with the reason.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from pipelines.home import home_path
from pipelines.reconcile import ACTIVE_DIR

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

STALLED_PERIODS = 2
"""A schedule with no completed run within this many of its periods is stalled."""


@dataclass(frozen=True)
class Stranded:
    """A run :func:`release_stranded` marked ``Crashed``."""

    deployment: str
    run_name: str
    state: str
    """Its state name when found (``Submitting``, ``Running``...)."""
    reason: str


@dataclass(frozen=True)
class Health:
    """One schedule as :func:`schedule_health` sees it."""

    deployment: str
    """``<flow>/<schedule name>``."""
    schedule: str
    """``every 20 s``, ``cron '0 2 * * *' (Europe/Berlin)``."""
    last_run: str | None
    last_state: str | None
    last_at: datetime | None
    next_at: datetime | None
    stalled: str | None
    """Why the schedule is stalled; None when it is not."""

    def to_json(self) -> dict[str, Any]:
        """Its fields, times as ISO 8601 strings (``info --json``)."""
        record = asdict(self)
        for key in ("last_at", "next_at"):
            record[key] = record[key].isoformat() if record[key] else None
        return record

    def line(self) -> str:
        """One line for ``serve``'s output."""
        last = (
            f"last run {self.last_run} {self.last_state} at {_hms(self.last_at)}"
            if self.last_run
            else "no run yet"
        )
        text = f"{self.deployment} ({self.schedule}): {last}, next {_hms(self.next_at)}"
        return text + (f"; STALLED: {self.stalled}" if self.stalled else "")


def _hms(when: datetime | None) -> str:
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _now() -> datetime:
    return datetime.now(UTC)


def _client() -> SyncPrefectClient:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _runs(
    client: SyncPrefectClient, deployment_ids: Iterable[UUID], types: list[Any], **kwargs: Any
) -> list[FlowRun]:
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterDeploymentId,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )

    run_filter = FlowRunFilter(
        deployment_id=FlowRunFilterDeploymentId(any_=list(deployment_ids)),
        state=FlowRunFilterState(type=FlowRunFilterStateType(any_=types)),
        **kwargs.pop("flow_run_filter", {}),
    )
    return list(client.read_flow_runs(flow_run_filter=run_filter, limit=200, **kwargs))


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
    with _client() as client:
        names = {d: client.read_deployment(d) for d in deployment_ids}
        mine = set() if in_flight is None else in_flight()
        for run in _runs(client, deployment_ids, holding):
            state = run.state
            if state is None or run.id in mine:
                continue
            age = (_now() - state.timestamp).total_seconds()
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
            label = _label(deployment) if deployment else "?"
            found.append(Stranded(label, run.name, str(state.name), message))
        # The crashes gave back the slots of runs that still had a lease; a slot whose lease
        # the server lost (it restarted) is given back here, down to the runs that hold one.
        # While serving, not while the runner has a submission the holders do not show yet
        # (between taking its slot and being read as Pending).
        holders = _runs(client, deployment_ids, holding)
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

    now = _now()
    near = now + timedelta(seconds=OVERLAP_MARGIN_S)
    done: dict[str, Missed] = {}
    with _client() as client:
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
                        message=f"{why} (due {_hms(due)}); "
                        f"only the latest missed run, {keep.name} ({keep.id}), ran",
                    ),
                    force=True,
                )
            label = _label(client.read_deployment(deployment_id))
            done[label] = Missed(len(missed), keep.name, len(close))
    return done


def _auto_scheduled(client: SyncPrefectClient, deployment_id: UUID) -> list[FlowRun]:
    from prefect.client.schemas.objects import StateType

    return [r for r in _runs(client, [deployment_id], [StateType.SCHEDULED]) if r.auto_scheduled]


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


def _label(deployment: Any) -> str:
    flow = deployment.entrypoint.rsplit(":", 1)[-1] if deployment.entrypoint else "?"
    return f"{flow}/{deployment.name}"


def _period_s(schedule: Any) -> float | None:
    """Seconds between two runs of a Prefect schedule (a cron's next two times)."""
    interval = getattr(schedule, "interval", None)
    if interval is not None:
        return float(interval.total_seconds())
    cron = getattr(schedule, "cron", None)
    if cron is None:
        return None
    from cronsim import CronSim  # what Prefect's own cron schedules are computed with

    times = CronSim(cron, _now())
    first = next(times)
    return float((next(times) - first).total_seconds())


def _describe(schedule: Any) -> str:
    interval = getattr(schedule, "interval", None)
    if interval is not None:
        return f"every {interval.total_seconds():g} s"
    return f"cron {getattr(schedule, 'cron', '?')!r} ({getattr(schedule, 'timezone', 'UTC')})"


def schedule_health(
    deployment_ids: list[UUID] | None = None, served_since: datetime | None = None
) -> list[Health]:
    """Each schedule of ``deployment_ids`` (default: every robo-pipe deployment on the Prefect
    API in use) with its last run, the next one and whether it is stalled, with the reason.
    ``served_since``: when this ``serve`` started serving them (the stall window starts no
    earlier: the time before is downtime, which :func:`skip_missed` deals with)."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags
    from prefect.client.schemas.objects import StateType

    now = _now()
    found: list[Health] = []
    with _client() as client:
        if deployment_ids is None:
            deployments = client.read_deployments(
                deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=["robo-pipe"]))
            )
        else:
            deployments = [client.read_deployment(d) for d in deployment_ids]
        for deployment in deployments:
            if not deployment.schedules:
                continue
            schedule = deployment.schedules[0].schedule
            period = _period_s(schedule)
            history = [
                r
                for r in _runs(
                    client, [deployment.id], [t for t in StateType if t != StateType.SCHEDULED]
                )
                if r.state
            ]
            history.sort(key=lambda r: r.state.timestamp if r.state else now, reverse=True)
            upcoming = _runs(client, [deployment.id], [StateType.SCHEDULED])
            # The last run that started (a Skipped or overlapping run never did).
            last = next((r for r in history if not _never_started(r)), None)
            stalled = None
            if period is not None:
                stalled = _stalled(client, deployment, history, now, period, served_since)
            found.append(
                Health(
                    deployment=_label(deployment),
                    schedule=_describe(schedule),
                    last_run=last.name if last else None,
                    last_state=str(last.state.name) if last and last.state else None,
                    last_at=last.state.timestamp if last and last.state else None,
                    next_at=min(
                        (r.expected_start_time for r in upcoming if r.expected_start_time),
                        default=None,
                    ),
                    stalled=stalled,
                )
            )
    return found


def _never_started(run: FlowRun) -> bool:
    """A Skipped run, or one cancelled as overlapping another (its flow never ran; Prefect
    gives a final run a start time all the same)."""
    return bool(run.state and run.state.is_cancelled() and not run.run_count)


def _stalled(
    client: SyncPrefectClient,
    deployment: Any,
    history: list[FlowRun],
    now: datetime,
    period: float,
    served_since: datetime | None,
) -> str | None:
    """Why ``deployment`` completed no run within :data:`STALLED_PERIODS` periods, or None."""
    window = timedelta(seconds=STALLED_PERIODS * period)
    completed = [r for r in history if r.state and r.state.is_completed()]
    since = completed[0].state.timestamp if completed and completed[0].state else deployment.created
    start = max(filter(None, [since, served_since]), default=None)
    if start is None or now - start <= window:
        return None
    what = (
        f"no completed run since {_hms(since)} "
        f"({STALLED_PERIODS} periods: {window.total_seconds():g} s)"
    )
    holding = [r for r in history if r.state and r.state.type.value in _HOLDING]
    limit = deployment.global_concurrency_limit
    if limit is not None:
        slots = client.read_global_concurrency_limit_by_name(limit.name).active_slots
        # A run that took the slot within the window is not why nothing completed in it.
        long_held = [r for r in holding if r.state and now - r.state.timestamp > window]
        if slots >= limit.limit and (long_held or not holding):
            if long_held:
                run = long_held[-1]
                assert run.state is not None
                held = _hms(run.state.timestamp)
                return f"{what}: slot held by run {run.name} ({run.state.name}) since {held}"
            return f"{what}: its slot is counted taken ({slots}/{limit.limit}) by no run"
    if deployment.paused:
        return f"{what}: the schedule is paused (no robo-pipe serve serves it)"
    if served_since is None and str(getattr(deployment, "status", "")).endswith("NOT_READY"):
        return f"{what}: no runner polls it (is robo-pipe serve running?)"
    ran = [r for r in history if r.state and r.state.is_final() and not _never_started(r)]
    if ran and ran[0].state and not ran[0].state.is_completed():
        latest = ran[0].state
        same = 0
        for run in ran:
            if not run.state or run.state.name != latest.name:
                break
            same += 1
        message = (latest.message or "")[:200]
        return f"{what}: last {same} run{'s' if same > 1 else ''} {latest.name}: {message}"
    skipped = [r for r in history if _never_started(r)]
    if skipped and skipped[0].state:
        message = (skipped[0].state.message or "")[:200]
        return f"{what}: its runs did not start: {skipped[0].state.name}: {message}"
    return f"{what}: no run started"


_HOLDING = ("PENDING", "RUNNING", "CANCELLING")


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
    for health in schedule_health(deployment_ids, served_since=_now()):
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

    since = _now()
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
