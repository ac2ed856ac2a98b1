"""Fleet rollouts: a registry version onto many edge devices, a canary first, then waves.

``deploy_fleet`` (a Prefect flow) builds and signs the release once, reads what every selected
device runs, then deploys wave by wave (the plan of :func:`deploy_edge.fleet.plan_waves`): one
``deploy_device`` task per device (:mod:`pipelines.deploy.device_steps`: what is done to one
device), the devices of a wave concurrently. A wave with more failures than the threshold
(any failure of the canary; an unreachable device is a failure) stops the rollout, and every
device this rollout updated is rolled back to the version it ran before
(:meth:`~deploy_edge.device.Device.rollback`: the previous slot becomes active again).
The flow run publishes a markdown summary artifact, and the model version gets one set of tags
per device (``robo_pipe.device.<name>.version/state/at/p99_ms``, and where it went live
``.variant/.choice``: what of the bundle runs there and why), so ``robo-pipe models show``
lists where a version runs.

States tell the truth: a device that does not end on the new version (refused, unreachable,
failed, and one reverted after the fact) is a Failed task run with its reason (the row is the
state's data); a rollout that did not put every device on the version is a Failed flow run
(Cancelled when a signal stopped it). :func:`roll_out` runs the flow and returns its
:class:`~pipelines.records.FleetResult` whatever its end.

Interrupts: inside :func:`stop_on_signals` (the ``deploy --fleet`` verb), SIGINT and SIGTERM
stop launching devices; the devices in flight end (or reach the fleet's device timeout), every
device this rollout updated is rolled back, and the rollout ends cancelled.

Every rollout has a record (:mod:`pipelines.deploy.rollouts`), written as it goes. A rollout
whose process was killed (SIGKILL, a power cut) is found by the next fleet command
(:func:`pipelines.deploy.followups.reconcile_rollouts`): it rolls back the devices that
rollout updated, tags the version as reverted there, and marks the record ``reconciled``.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings
from prefect.states import Cancelled, Failed, State
from prefect.task_runners import ThreadPoolTaskRunner

from deploy_edge.fleet import canary_size, check_tokens, load_selection, plan_waves, wave_failed
from deploy_edge.wire import Origin
from pipelines.deploy import release, rollouts
from pipelines.deploy.device_steps import (
    FLEET_WORKERS,
    STEPS,
    deploy_device,
    device_state,
    each_device,
    label_of,
    read_statuses,
    revert,
    show_row,
)
from pipelines.deploy.rollout_summary import fleet_artifact_key, summary_markdown
from pipelines.progress import BROADCAST
from pipelines.records import DeviceRollout, DeviceState, FleetResult
from pipelines.registry.versions import VersionInfo, set_version_tags


def fleet_status(fleet: str | Path, selectors: Sequence[str] = ()) -> list[DeviceState]:
    """Every selected device's state, read at once (an unreachable one says why)."""
    _, devices = load_selection(fleet, selectors)
    check_tokens(devices)
    return each_device(devices, device_state)


def plan(
    version: VersionInfo,
    fleet: str | Path,
    canary: int | None = None,
    select_: Sequence[str] = (),
) -> FleetResult:
    """The rollout of ``version`` that ``deploy_fleet`` would do, changing nothing: the waves,
    and what each device runs now (an unreachable one says why)."""
    parsed, devices = load_selection(fleet, select_)
    check_tokens(devices)
    waves = plan_waves(devices, parsed.rollout, canary)
    canary_devices = canary_size(waves, parsed.rollout, canary)
    answers = read_statuses(devices)
    rows = []
    for number, wave in enumerate(waves):
        for device in wave:
            answer = answers[device.name]
            before = label_of(answer.active) if not isinstance(answer, str) else None
            reason = answer if isinstance(answer, str) else ""
            rows.append(DeviceRollout(device.name, number, before, before, "planned", reason))
    return FleetResult(
        version.name,
        version.version,
        str(fleet),
        [[d.name for d in w] for w in waves],
        rows,
        canary=canary_devices,
        dry_run=True,
        at=release.utc_stamp(),
    )


class _StopRequest:
    """A SIGINT or SIGTERM received while a rollout runs (see :func:`stop_on_signals`)."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signum = 0

    @property
    def name(self) -> str:
        """``SIGINT`` / ``SIGTERM`` ("": none received)."""
        return signal.Signals(self.signum).name if self.signum else ""


STOP = _StopRequest()
"""Set by :func:`stop_on_signals`' handlers; read by the flow between devices and waves."""


@contextmanager
def stop_on_signals() -> Iterator[_StopRequest]:
    """While the block runs (on the main thread): SIGINT and SIGTERM ask the rollout to stop
    instead of raising in the middle of a device's step or of Prefect's own calls; the flow
    then stops launching devices, waits for those in flight, rolls back what it updated and
    ends cancelled. A signal the caller ignores stays ignored. A second signal does not cut
    the roll-back short (SIGKILL does; the next fleet command then reconciles)."""
    STOP.event.clear()
    STOP.signum = 0

    def asked(signum: int, _frame: object) -> None:
        # On stderr, past Prefect's print capture: stdout is the --json document alone.
        name = signal.Signals(signum).name
        if STOP.event.is_set():
            sys.stderr.write(f"{name} again: still stopping (rolling back)\n")
            return
        STOP.signum = signum
        STOP.event.set()
        sys.stderr.write(f"{name}: stopping the rollout\n")

    if threading.current_thread() is not threading.main_thread():
        yield STOP
        return
    previous = {
        signum: signal.signal(signum, asked)
        for signum in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(signum) is not signal.SIG_IGN
    }
    try:
        yield STOP
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _row_of(future: Any) -> DeviceRollout:
    """A ``deploy_device`` future's row, whether its task run Completed or Failed."""
    row = future.result(raise_on_failure=False)
    if not isinstance(row, DeviceRollout):  # the task crashed: Prefect holds the exception
        raise row if isinstance(row, BaseException) else TypeError(f"no row: {row!r}")
    return row


def _fail_task_run(task_run_id: Any, reason: str) -> None:
    """Put a task run that Completed (the device took the version) in a Failed state, once
    its device has been rolled back; a Prefect that does not answer is said, not raised."""
    from prefect.client.orchestration import get_client

    try:
        with get_client(sync_client=True) as prefect:
            prefect.set_task_run_state(task_run_id, Failed(message=reason), force=True)
    except Exception as err:  # the rollout's record and tags say it; the UI lags
        print(f"could not mark task run {task_run_id} Failed: {err}")


@flow(
    name="deploy_fleet",
    log_prints=True,
    persist_result=False,
    task_runner=ThreadPoolTaskRunner(max_workers=FLEET_WORKERS),  # type: ignore[arg-type]
)
def deploy_fleet(
    version: VersionInfo,
    fleet: str,
    canary: int | None = None,
    max_failures: int | None = None,
    select: list[str] | None = None,
    force: bool = False,
    key: str | None = None,
    max_parallel: int | None = None,
    pause_s: float | None = None,
    only: list[str] | None = None,
) -> FleetResult | State[FleetResult]:
    """Roll a registry version out to a fleet: the canary, then the waves (see the module
    docstring). The flow run Completes (returning the result) only when every selected device
    runs the version; else it ends Failed, or Cancelled after a signal, with the result as
    the state's data: call it through :func:`roll_out`.

    Args:
        version: the registry version to roll out (resolved: an alias was read once).
        fleet: fleet file (devices and rollout policy).
        canary: devices of the canary wave (default: the fleet file's).
        max_failures: failures a wave may have (default: the fleet file's rule).
        select: ``label=value`` selectors (every one must match).
        force: allow a downgrade or an expired release (the agent records it).
        key: signing key (default ``$ROBO_PIPE_HOME/keys/robo-pipe.key``).
        max_parallel: most devices of a wave deployed at once (default: the whole wave).
        pause_s: seconds between waves (default: the fleet file's ``pause_s``).
        only: of the selected devices, only these names (``--retry-failed``, ``--resume``:
            :mod:`pipelines.deploy.followups`); the waves are planned over them.
    """
    from prefect.context import get_run_context

    from pipelines.services.settings import check_services, configure

    check_services(configure())
    started, at = time.perf_counter(), release.utc_stamp()
    parsed, devices = load_selection(fleet, select or [])
    if only is not None:
        devices = [d for d in devices if d.name in only]
    check_tokens(devices)
    policy = parsed.rollout
    if pause_s is not None:
        policy = policy.model_copy(update={"pause_s": pause_s})
    waves = plan_waves(devices, policy, canary)
    canary_devices = canary_size(waves, policy, canary)
    flow_run = get_run_context().flow_run  # type: ignore[union-attr]
    record = rollouts.new_record(version.name, version.version, fleet, list(select or []))
    record.waves = [[d.name for d in w] for w in waves]
    record.flow_run_id = str(flow_run.id) if flow_run else ""
    record.flow_run_url = _flow_run_url(record.flow_run_id)
    origin = Origin(by="fleet", rollout=record.id, flow_run=record.flow_run_url)
    rollouts.save(record)  # from here a killed rollout is found by the next fleet command
    print(f"rollout {record.id}")
    manifest, release_file = release.bundle_release(
        version, Path(key) if key else release.default_key()
    )
    from robo_pipe.integrity import file_sha256

    sha256, new = file_sha256(release_file), f"{manifest.model_name}:{manifest.model_version}"
    answers = read_statuses(devices)
    befores = {
        n: label_of(a.active) if not isinstance(a, str) else None for n, a in answers.items()
    }
    runs_it = {
        n: not isinstance(a, str) and release.runs_release(a.active, manifest, sha256)
        for n, a in answers.items()
    }
    for number, wave in enumerate(waves):
        for device in wave:
            BROADCAST.started(device.name, len(STEPS), "")
            BROADCAST.advanced(device.name, 0, f"wave {number}: waiting")
    rows: dict[str, DeviceRollout] = {}
    task_runs: dict[str, Any] = {}
    stopped, why = None, ""
    for number, wave in enumerate(waves):
        if number and policy.pause_s and not STOP.event.is_set():
            print(f"pausing {policy.pause_s:g} s before wave {number}")
            STOP.event.wait(policy.pause_s)  # a signal ends the pause at once
        step = max_parallel or len(wave)
        for first in range(0, len(wave), step):
            if STOP.event.is_set():
                break
            batch = wave[first : first + step]
            for device in batch:  # on record before it starts: a kill mid-step is repaired
                before = befores[device.name]
                record.put(DeviceRollout(device.name, number, before, before, "deploying"))
            rollouts.save(record)
            futures = [
                deploy_device.with_options(task_run_name=f"{device.name}-wave{number}").submit(
                    device,
                    number,
                    str(release_file),
                    sha256,
                    new,
                    befores[device.name],
                    runs_it[device.name],
                    force,
                    policy.device_timeout_s,
                    origin,
                )
                for device in batch
            ]
            for device, future in zip(batch, futures, strict=True):
                rows[device.name] = row = _row_of(future)
                task_runs[device.name] = future.task_run_id
                record.put(row)
                rollouts.save(record)
                show_row(row)
        if STOP.event.is_set():
            why = f"{STOP.name} during wave {number}"
            print(f"rollout cancelled: {why}")
            break
        failed = [rows[d.name] for d in wave if rows[d.name].state not in ("active", "staged")]
        is_canary = number == 0 and canary_devices > 0
        if wave_failed(len(failed), len(wave), policy, max_failures, canary=is_canary):
            stopped = number
            what = "canary" if is_canary else f"wave {number}"
            names = ", ".join(r.device for r in failed)
            why = f"{what}: {len(failed)} of {len(wave)} failed ({names})"
            print(f"rollout stopped at {why}")
            break
    by_name = {d.name: d for d in devices}
    if stopped is not None or STOP.event.is_set():
        stop_word = "was cancelled" if STOP.event.is_set() else "stopped"
        # what this rollout made active (a device that ran it already has no deployment id)
        updated = [r for r in rows.values() if r.state == "active" and r.deployment_id]
        each_device(
            [by_name[r.device] for r in updated],
            lambda d: revert(d, rows[d.name], f"the rollout {stop_word} ({why})", origin),
        )
        for row in updated:
            record.put(row)
            show_row(row)
            if row.state == "reverted":
                _fail_task_run(task_runs[row.device], row.reason)
        rollouts.save(record)
    skipped_why = f"the rollout {'was cancelled' if STOP.event.is_set() else 'stopped'} first"
    ordered = []
    for number, wave in enumerate(waves):
        for device in wave:
            if device.name not in rows:
                before = befores[device.name]
                rows[device.name] = DeviceRollout(
                    device.name, number, before, before, "skipped", skipped_why
                )
                show_row(rows[device.name])
            ordered.append(rows[device.name])
    result = FleetResult(
        manifest.model_name,
        manifest.model_version,
        str(fleet),
        [[d.name for d in w] for w in waves],
        ordered,
        canary=canary_devices,
        stopped_at_wave=stopped,
        reason=why,
        flow_run_id=record.flow_run_id,
        seconds=time.perf_counter() - started,
        at=at,
        rollout_id=record.id,
        cancelled_by=STOP.name,
    )
    record_rollout(result)
    record.devices, record.reason, record.ended = ordered, why, release.utc_stamp()
    record.state = result.state
    rollouts.save(record)
    if result.cancelled_by:
        return Cancelled(message=f"cancelled by {why}; {result.rolled_back}", data=result)
    if not result.complete:
        said = f"stopped at {why}; {result.rolled_back}" if stopped is not None else ""
        return Failed(message=said or f"not every device runs {new}", data=result)
    return result


def _flow_run_url(flow_run_id: str) -> str:
    """The flow run's page on the Prefect UI this process reports to; its id alone on the
    temporary server of this process (no page outlives it)."""
    from pipelines.services.settings import configure

    prefect_ui = configure(create=False).prefect_ui
    return f"{prefect_ui}/runs/flow-run/{flow_run_id}" if prefect_ui else flow_run_id


def roll_out(**arguments: Any) -> FleetResult:
    """Run :func:`deploy_fleet` (same arguments) and return its result whatever its end
    (Completed, Failed, Cancelled); an exception the flow raised is raised again.

    Without Prefect's flow-run heartbeats: their thread sleeps in 1 s steps and the flow's end
    waits for it (0-1 s, half a second on average, of a fleet command's ~3 s), and a rollout
    needs none. Its own record says when its process died, and the next fleet command marks
    its flow run Crashed (:func:`pipelines.deploy.followups.reconcile_rollouts`)."""
    with temporary_settings(updates={PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
        state = deploy_fleet(**arguments, return_state=True)
    result = state.result(raise_on_failure=False)
    if not isinstance(result, FleetResult):
        raise result if isinstance(result, BaseException) else TypeError(f"no result: {result!r}")
    return result


def record_rollout(result: FleetResult) -> None:
    """The per-device tags on the model version (and on the version a device left), and the
    flow run's summary artifact."""
    from prefect.artifacts import create_markdown_artifact

    new = result.label
    tags: dict[str, Any] = {}
    for row in result.devices:
        if row.state in ("skipped", "planned"):
            continue
        p99 = f"{row.p99_ms:.2f}" if row.p99_ms is not None else "-"
        at = row.at or result.at
        tags |= release.device_tags(
            row.device, version=row.after or "none", state=row.state, at=at, p99_ms=p99
        )
        left = row.before if row.state == "active" and row.before != new else None
        if left and (problem := release.mark_replaced(row.device, left, new, result.at)):
            print(problem)
    set_version_tags(result.model_name, result.model_version, tags)
    create_markdown_artifact(
        key=fleet_artifact_key(result.model_name),
        markdown=summary_markdown(result),
        description=f"fleet rollout of {new} ({result.fleet})",
    )


__all__ = [
    "STOP",
    "deploy_fleet",
    "fleet_status",
    "plan",
    "roll_out",
    "stop_on_signals",
]
