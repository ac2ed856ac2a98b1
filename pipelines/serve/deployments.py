"""Prefect deployments from a config's ``schedules:`` (``robo-pipe serve``).

Each schedule becomes a deployment of one of the flows in :mod:`pipelines.run.flow`, named
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
from pipelines.run.flow import champion_regression, train_simulate_deploy
from robo_pipe.errors import ServiceFailure

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment
    from prefect.schedules import Schedule

    from pipelines.services.local_servers import LocalServers

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


STOP_BOUND_S = 15.0
"""How long ``serve`` takes at most from SIGTERM or Ctrl-C (SIGINT to its process group) to
exit, even with its Prefect server gone: the runner's own stop gets most of it, then whatever
is left is abandoned (the servers it started are stopped all the same)."""

WATCH_EVERY_S = 2.0
"""How often ``serve`` asks the Prefect API's ``/health``; two misses in a row (or the exit of
the server it started) mean the server is gone."""


class ServerGone(ServiceFailure):
    """The Prefect server ``serve`` used went away for good (exit code 3)."""


def serve(
    deployments: list[RunnerDeployment],
    servers: LocalServers | None = None,
    attached: str | None = None,
    say: Callable[[str], None] | None = None,
) -> None:
    """Register ``deployments`` and run their flow runs until SIGTERM or Ctrl-C (SIGINT, unless
    this process ignores it: see :func:`pipelines.services.signals.stop_on_sigterm`), then raise
    :class:`~pipelines.services.signals.Stopped` with that signal.

    Runs execute in subprocesses that report to the same Prefect API as this process. Either
    signal stops it the same way: runs still in progress are cancelled (their processes
    stopped, their state ``Cancelled``: "Runner is shutting down."), then the deployments'
    schedules are paused (no runs pile up while nothing serves them; the next ``serve``
    resumes them). It exits within :data:`STOP_BOUND_S` of the signal.

    The Prefect API is watched (:data:`WATCH_EVERY_S`). If it stops answering, ``say`` gets one
    line, then: with ``servers`` (the ones this ``serve`` started), the Prefect server is
    started again on the same port and serving goes on; otherwise (``attached``: whose servers
    they were, e.g. ``robo-pipe ui (pid 4321)``, or a configured PREFECT_API_URL) it stops,
    without the API calls a clean stop makes, and raises :class:`ServerGone`.
    """
    import asyncio
    import os
    import sys
    import threading
    import time

    from prefect.runner import Runner

    from pipelines.serve import schedules
    from pipelines.services.settings import healthy, no_prefect_retries
    from pipelines.services.signals import Stopped

    if say is None:

        def say(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    tell: Callable[[str], None] = say
    api = os.environ.get("PREFECT_API_URL", "").rstrip("/")

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
    schedules.at_serve_start(ids, tell)  # before the runner polls: see pipelines.serve.schedules
    received: list[int] = []
    gone: list[str] = []

    def hard_exit(code: int) -> None:
        # The bound passed: whatever still waits (an API call, a task that ignores its
        # cancellation) is abandoned. The servers this serve started go with it.
        tell(gone[0] if gone else f"serve did not stop within {STOP_BOUND_S:g} s; exiting")
        if servers is not None:
            servers.stop()
        os._exit(code)

    async def watch_api() -> None:
        """Return when the Prefect server is gone for good (after saying so); restart our
        own meanwhile."""
        misses = 0
        while True:
            await asyncio.sleep(WATCH_EVERY_S)
            died = servers is not None and not servers.prefect_alive()
            if not died:
                ok = await asyncio.to_thread(healthy, f"{api}/health")
                misses = 0 if ok else misses + 1
                if misses < 2:
                    continue
            misses = 0
            if servers is None:
                whose = f"the servers of {attached}" if attached else f"PREFECT_API_URL {api}"
                gone.append(
                    f"the Prefect server at {api} ({whose}) stopped answering: serve stops "
                    "(start it again, then serve)"
                )
                return
            code = servers.processes[0].poll()
            why = f"exited with code {code}" if code is not None else "stopped answering"
            tell(
                f"the Prefect server at {api} (pid {servers.processes[0].pid}) {why}: "
                f"starting it again on port {servers.prefect_port}"
            )
            started = time.monotonic()
            servers.restart_prefect()  # on this (the main) thread: see LocalServers._spawn
            while not await asyncio.to_thread(healthy, f"{api}/health"):
                if not servers.prefect_alive() or time.monotonic() - started > 120:
                    gone.append(
                        f"the Prefect server at {api} did not start again (see its log "
                        "under $ROBO_PIPE_HOME/prefect): serve stops"
                    )
                    return
                await asyncio.sleep(0.5)
            tell(
                f"the Prefect server is back on port {servers.prefect_port} after "
                f"{time.monotonic() - started:.0f} s; serving goes on"
            )

    def terminate_run_processes() -> list[UUID]:
        """SIGTERM the process of every flow run the runner still tracks; their ids."""
        manager = runner._process_manager  # private: Prefect has no public way to this
        signalled = []
        for flow_run_id in list(manager.flow_run_ids()):
            handle = manager.get(flow_run_id)
            if handle is not None and handle.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(handle.pid, signal.SIGTERM)
                signalled.append(flow_run_id)
        return signalled

    def quit_without_server() -> None:
        """Stop with no API calls that would wait for a server that is gone: no retries, no
        pausing, our flow processes stopped directly."""
        no_prefect_retries()
        runner.pause_on_shutdown = False
        terminate_run_processes()

    async def run_until_signalled() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def stop_on(signum: int) -> None:
            received.append(signum)
            stop.set()

        def on_sigterm() -> None:
            loop.call_soon_threadsafe(stop_on, signal.SIGTERM)

        runner.on_sigterm = on_sigterm
        loop.set_exception_handler(_quiet_cancelled)
        _one_line_errors(_OBSERVER_LOGGERS)
        for signum in (signal.SIGINT, signal.SIGTERM):
            if signal.getsignal(signum) is not signal.SIG_IGN:  # an ignored SIGINT stays so
                loop.add_signal_handler(signum, stop_on, signum)
        serving = asyncio.create_task(runner.start())
        signalled = asyncio.create_task(stop.wait())
        watching = asyncio.create_task(watch_api())
        in_flight = schedules.runner_in_flight(runner)
        keeping = asyncio.create_task(schedules.keep_watch(ids, in_flight, tell))
        await asyncio.wait({serving, signalled, watching}, return_when=asyncio.FIRST_COMPLETED)
        deadline = threading.Timer(
            STOP_BOUND_S, hard_exit, (3 if gone else 128 + (received or [signal.SIGTERM])[0],)
        )
        deadline.daemon = True
        deadline.start()
        watching.cancel()
        keeping.cancel()
        server_up = not gone and await asyncio.to_thread(healthy, f"{api}/health")
        stragglers: list[UUID] = []
        if not server_up:
            if not gone:
                tell(f"the Prefect server at {api} does not answer: stopping without it")
            quit_without_server()
            serving.cancel()
        elif signalled.done() and runner.started:
            # Prefect's Ctrl-C path skips this: runs stayed Running. Bounded: a server that
            # goes away meanwhile must not hold the stop.
            stopping = asyncio.ensure_future(runner.astop())
            await asyncio.wait({stopping}, timeout=STOP_BOUND_S - 6)
            if not stopping.done():
                # A run's process is slow to exit (the runner waits for each in turn, seen
                # taking >9 s on a loaded CI machine): signal the rest at once, and mark what
                # the runner did not get to below, as it would have.
                stragglers = terminate_run_processes()
                serving.cancel()
        elif not serving.done():  # signalled before the runner got going: nothing runs yet
            serving.cancel()
        signalled.cancel()
        await asyncio.wait({serving}, timeout=2)  # not wait_for: it waits for the cancel
        if signalled.done() and server_up:
            settling = asyncio.ensure_future(settle_stopped_runs(ids, stragglers))
            await asyncio.wait({settling}, timeout=3)
        deadline.cancel()

    # Closing the loop resets the signals it handled to Python's defaults (SIGTERM: die at
    # once): the caller's handlers come back, so that stopping its servers is not cut short.
    previous = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        asyncio.run(run_until_signalled())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _flush_to_api()
    if gone:
        raise ServerGone(gone[0])
    if received:
        raise Stopped(received[0])


_OBSERVER_LOGGERS = (
    "prefect.FlowRunCancellingObserver",
    "prefect.FlowRunSuspendingObserver",
    "prefect.events.clients",
)
"""The runner's parts that log a traceback when the Prefect server goes away (their
websocket closed); :func:`_one_line_errors` makes each such record one line."""


class _OneLine:
    """A logging filter that turns a record's traceback into ``: ExceptionName: message``."""

    def filter(self, record: Any) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            record.msg = f"{record.getMessage()}: {type(error).__name__}: {error}"
            record.args = None
            record.exc_info = None
            record.exc_text = None
        return True


def _one_line_errors(names: tuple[str, ...]) -> None:
    import logging

    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _OneLine) for f in logger.filters):
            logger.addFilter(_OneLine())


def _quiet_cancelled(loop: Any, context: dict[str, Any]) -> None:
    """The loop's exception handler: a task cancelled on the way out is no error (Prefect
    3.8's observers ask a cancelled task for its exception, which raises CancelledError)."""
    import asyncio

    if isinstance(context.get("exception"), asyncio.CancelledError):
        return
    loop.default_exception_handler(context)


def _flush_to_api() -> None:
    """Send the logs and events still queued for the Prefect API now, while its server is up
    (the caller stops its own servers next), each within 3 s and with no retries: Python's exit
    would otherwise send them to a server that is gone, retrying each for a minute."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    from pipelines.services.settings import no_prefect_retries

    no_prefect_retries()
    for worker in (APILogWorker, EventsWorker):
        worker.drain_all(timeout=3)


SHUTDOWN_MESSAGE = "Runner is shutting down."
"""The message of the ``Cancelled`` state Prefect's runner gives the runs it stops."""


async def settle_stopped_runs(deployment_ids: list[UUID], stragglers: list[UUID]) -> None:
    """Leave no run of ``deployment_ids`` ``Running`` after a stop, and none wrongly
    ``Cancelled``: each of ``stragglers`` (runs whose processes ``serve`` signalled after the
    runner's own stop ran out of time) still unfinished is marked ``Cancelled`` with
    :data:`SHUTDOWN_MESSAGE`, as the runner marks those it stops; then a run so marked after it
    had finished gets its final state back (Prefect 3.8 cancels every run whose process has not
    exited yet, and a run's process takes seconds to exit after its flow completed)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterId,
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled, State

    async with get_client() as client:
        for flow_run_id in stragglers:
            state = (await client.read_flow_run(flow_run_id)).state
            if state is None or not state.is_final():
                await client.set_flow_run_state(
                    flow_run_id, Cancelled(message=SHUTDOWN_MESSAGE), force=True
                )
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
