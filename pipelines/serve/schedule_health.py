"""The health of served schedules: per schedule, its last run, its state, the next run, and
whether it is stalled (no completed run within :data:`STALLED_PERIODS` periods), with the
reason; and the reads of the Prefect API it shares with :mod:`pipelines.serve.schedules`.

``serve`` prints each schedule's :class:`ScheduleHealth` at start and whenever it changes;
``robo-pipe info`` shows it. (A device's health is :class:`deploy_edge.wire.Health`.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:
    from prefect.client.orchestration import SyncPrefectClient
    from prefect.client.schemas.objects import FlowRun

STALLED_PERIODS = 2
"""A schedule with no completed run within this many of its periods is stalled."""


@dataclass(frozen=True)
class ScheduleHealth:
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
            f"last run {self.last_run} {self.last_state} at {hms(self.last_at)}"
            if self.last_run
            else "no run yet"
        )
        text = f"{self.deployment} ({self.schedule}): {last}, next {hms(self.next_at)}"
        return text + (f"; STALLED: {self.stalled}" if self.stalled else "")


def hms(when: datetime | None) -> str:
    """``when`` as ``YYYY-MM-DD HH:MM:SS UTC`` (``-`` for None), as ``serve`` prints times."""
    return "-" if when is None else when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def utc_now() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


def sync_client() -> SyncPrefectClient:
    """A synchronous client of the Prefect API in use."""
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def runs_of(
    client: SyncPrefectClient, deployment_ids: Iterable[UUID], types: list[Any], **kwargs: Any
) -> list[FlowRun]:
    """The flow runs of ``deployment_ids`` in one of the state ``types`` (at most 200)."""
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


def deployment_label(deployment: Any) -> str:
    """``<flow>/<schedule name>``: how ``serve`` names a deployment."""
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

    times = CronSim(cron, utc_now())
    first = next(times)
    return float((next(times) - first).total_seconds())


def _describe(schedule: Any) -> str:
    interval = getattr(schedule, "interval", None)
    if interval is not None:
        return f"every {interval.total_seconds():g} s"
    return f"cron {getattr(schedule, 'cron', '?')!r} ({getattr(schedule, 'timezone', 'UTC')})"


def schedule_health(
    deployment_ids: list[UUID] | None = None, served_since: datetime | None = None
) -> list[ScheduleHealth]:
    """Each schedule of ``deployment_ids`` (default: every robo-pipe deployment on the Prefect
    API in use) with its last run, the next one and whether it is stalled, with the reason.
    ``served_since``: when this ``serve`` started serving them (the stall window starts no
    earlier: the time before is downtime, which :func:`skip_missed` deals with)."""
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterTags
    from prefect.client.schemas.objects import StateType

    now = utc_now()
    found: list[ScheduleHealth] = []
    with sync_client() as client:
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
                for r in runs_of(
                    client, [deployment.id], [t for t in StateType if t != StateType.SCHEDULED]
                )
                if r.state
            ]
            history.sort(key=lambda r: r.state.timestamp if r.state else now, reverse=True)
            upcoming = runs_of(client, [deployment.id], [StateType.SCHEDULED])
            # The last run that started (a Skipped or overlapping run never did).
            last = next((r for r in history if not _never_started(r)), None)
            stalled = None
            if period is not None:
                stalled = _stalled(client, deployment, history, now, period, served_since)
            found.append(
                ScheduleHealth(
                    deployment=deployment_label(deployment),
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
        f"no completed run since {hms(since)} "
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
                held = hms(run.state.timestamp)
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
