"""Prefect deployments from a config's ``schedules:`` (``robo-pipe serve``).

Each schedule becomes a deployment of one of the flows in :mod:`pipelines.flow`, named
``<flow>/<schedule name>``, with a cron (in its time zone) or an interval, and parameters that
point back at the same config file (plus the schedule's own ``set`` overrides). ``robo-pipe
serve`` registers them and runs their flow runs (scheduled, or started from the UI or the API)
in subprocesses of its runner until stopped; teams with a work pool deploy the same flows with
``prefect deploy`` (see ``prefect.yaml``).

One run of a deployment at a time: a second one either waits for the running one or is
skipped, by :data:`OVERLAP`, and Prefect's UI says which (``AwaitingConcurrencySlot``, or
``Cancelled`` with the reason).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal
from uuid import UUID

from prefect import Flow

from pipelines.config import PipelineConfig, ScheduleConfig
from pipelines.flow import champion_regression, train_simulate_deploy

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Schedule

FLOWS: dict[str, Flow[..., Any]] = {
    "train_simulate_deploy": train_simulate_deploy,
    "champion_regression": champion_regression,
}

OVERLAP: dict[str, Literal["ENQUEUE", "CANCEL_NEW"]] = {
    # Each retrain matters (a run started from the UI may carry other parameters): it waits.
    "train_simulate_deploy": "ENQUEUE",
    # A check that would start while another check runs adds nothing: it is skipped.
    "champion_regression": "CANCEL_NEW",
}
"""What happens to a run of a deployment that starts while another run of it is running."""


def schedule_of(entry: ScheduleConfig) -> Schedule:
    """The Prefect schedule of one ``schedules:`` entry."""
    from prefect.schedules import Cron, Interval

    if entry.cron is not None:
        return Cron(entry.cron, timezone=entry.timezone)
    assert entry.interval_s is not None  # the config guarantees one of the two
    return Interval(entry.interval_s, timezone=entry.timezone)


def build_deployments(
    cfg: PipelineConfig,
    config_path: Path,
    overrides: list[str],
    ray_address: str | None = None,
) -> list[RunnerDeployment]:
    """One deployment per ``cfg.schedules`` entry (none if the config has no schedules)."""
    from prefect.client.schemas.objects import ConcurrencyLimitConfig, ConcurrencyLimitStrategy

    deployments: list[RunnerDeployment] = []
    for entry in cfg.schedules:
        overlap = OVERLAP[entry.flow]
        waits = "a later run waits" if overlap == "ENQUEUE" else "an overlapping run is skipped"
        deployments.append(
            FLOWS[entry.flow].to_deployment(  # type: ignore[arg-type]  # sync call: no coroutine
                name=entry.name,
                schedule=schedule_of(entry),
                parameters={
                    "config": str(config_path.resolve()),
                    "overrides": [*overrides, *entry.set],
                    "ray_address": ray_address,
                },
                tags=["robo-pipe", cfg.name],
                concurrency_limit=ConcurrencyLimitConfig(
                    limit=1, collision_strategy=ConcurrencyLimitStrategy(overlap)
                ),
                description=f"{entry.flow} of {config_path.name} {describe_schedule(entry)}; "
                f"one run at a time: {waits}",
            )
        )
    return deployments


def describe_schedule(entry: ScheduleConfig) -> str:
    """``on cron '0 2 * * *' (Europe/Berlin)`` or ``every 3600 s``."""
    if entry.cron:
        return f"on cron {entry.cron!r} ({entry.timezone})"
    return f"every {entry.interval_s:g} s"


def serve(deployments: list[RunnerDeployment]) -> None:
    """Register ``deployments`` and run their flow runs until SIGTERM or Ctrl-C (SIGINT, unless
    this process ignores it: see :func:`pipelines.services.stop_on_sigterm`), then raise
    :class:`~pipelines.services.Stopped` with that signal.

    Runs execute in subprocesses that report to the same Prefect API as this process. Either
    signal stops it the same way: runs still in progress are cancelled (their processes
    stopped, their state ``Cancelled``: "Runner is shutting down."), then the deployments'
    schedules are paused (no runs pile up while nothing serves them; the next ``serve``
    resumes them).
    """
    import asyncio

    from prefect.runner import Runner

    from pipelines.services import Stopped

    class _Runner(Runner):
        on_sigterm: Callable[[], None] | None = None

        def handle_sigterm(self, *args: Any, **kwargs: Any) -> None:
            # Runner.start() installs this over the loop's SIGTERM handler. Prefect 3.8's own
            # calls the async stop() without awaiting it and exits at once, leaving runs in
            # progress `Running`: stop as on the loop's handler instead.
            if self.on_sigterm is not None:
                self.on_sigterm()

    runner = _Runner(pause_on_shutdown=True)
    ids: list[UUID] = []
    for deployment in deployments:
        deployment_id = runner.add_deployment(deployment)
        assert isinstance(deployment_id, UUID)  # called from sync code: no coroutine
        ids.append(deployment_id)
    received: list[int] = []

    async def run_until_signalled() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stop_on(signum: int) -> None:
            received.append(signum)
            stop.set()

        def on_sigterm() -> None:
            loop.call_soon_threadsafe(stop_on, signal.SIGTERM)

        runner.on_sigterm = on_sigterm
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # an ignored SIGINT stays so
                loop.add_signal_handler(signum, stop_on, signum)
        serving = asyncio.create_task(runner.start())
        signalled = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, signalled}, return_when=asyncio.FIRST_COMPLETED)
        if signalled.done():
            if runner.started:
                await runner.astop()  # Prefect's Ctrl-C path skips this: runs stayed Running
            else:  # signalled before the runner got going: nothing runs yet
                serving.cancel()
        signalled.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        if signalled.done():
            await _restore_finished_runs(ids)

    # Closing the loop resets the signals it handled to Python's defaults (SIGTERM: die at
    # once): the caller's handlers come back, so that stopping its servers is not cut short.
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(run_until_signalled())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:
        raise Stopped(received[0])


SHUTDOWN_MESSAGE = "Runner is shutting down."
"""The message of the ``Cancelled`` state Prefect's runner gives the runs it stops."""


async def _restore_finished_runs(deployment_ids: list[UUID]) -> None:
    """Give back its final state to a run the stopping runner marked ``Cancelled`` after it had
    finished: Prefect 3.8 cancels every run whose process has not exited yet, and a run's
    process takes seconds to exit after its flow completed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import State

    async with get_client() as client:
        cancelled = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=deployment_ids)),
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.CANCELLED]))
            ),
        )
        for run in cancelled:
            if run.state is None or run.state.message != SHUTDOWN_MESSAGE:
                continue
            history = sorted(await client.read_flow_run_states(run.id), key=lambda s: s.timestamp)
            finished = [state for state in history[:-1] if state.is_final()]
            if finished:
                last = finished[-1]
                await client.set_flow_run_state(
                    run.id, State(type=last.type, name=last.name, message=last.message), force=True
                )
