"""Fleet rollouts: a registry version onto many edge devices, a canary first, then waves.

``deploy_fleet`` (a Prefect flow) builds and signs the release once, reads what every selected
device runs, then deploys wave by wave (the plan of :func:`deploy_edge.fleet.plan_waves`): one
``deploy_device`` task per device, the devices of a wave concurrently. A wave with more
failures than the threshold (any failure of the canary; an unreachable device is a failure)
stops the rollout, and every device this rollout updated is rolled back to the version it ran
before (:meth:`~deploy_edge.device.Device.rollback`: the previous slot becomes active again).
The flow run publishes a markdown summary artifact, and the model version gets one set of tags
per device (``robo_pipe.device.<name>.version/state/at/p99_ms``, and where it went live
``.variant/.choice``: what of the bundle runs there and why), so ``robo-pipe models show``
lists where a version runs.

Devices are reached through :func:`deploy_edge.device.connect` (whatever their kind) and
answer with the records of :mod:`deploy_edge.wire`.

Per-device progress goes to this process's listeners (:func:`pipelines.progress.listening`):
one row per device, named after it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from prefect import flow, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner
from rich.markup import escape

from deploy_edge.device import DeviceError, connect
from deploy_edge.fleet import (
    FleetDevice,
    canary_size,
    check_tokens,
    load_selection,
    plan_waves,
    wave_failed,
)
from deploy_edge.wire import STEPS as DEVICE_STEPS
from pipelines import registry
from pipelines.deploy import release
from pipelines.progress import BROADCAST
from pipelines.records import DeviceRollout, DeviceState, FleetResult
from pipelines.summary import fleet_artifact_key, summary_markdown

if TYPE_CHECKING:
    from deploy_edge.wire import Deployment, DeviceStatus, Slot

T = TypeVar("T")


STEPS = ("upload", *DEVICE_STEPS)
"""The steps of one device's deployment (its progress bar)."""
FLEET_WORKERS = 64
"""Most devices of one wave deployed at once."""


# -- helpers -------------------------------------------------------------------------------------


def _label(slot: Slot | None) -> str | None:
    return slot.label if slot is not None else None


def _each(devices: Sequence[FleetDevice], work: Callable[[FleetDevice], T]) -> list[T]:
    """``work`` on every device at once (threads), results in device order."""
    if not devices:
        return []
    with ThreadPoolExecutor(max_workers=min(FLEET_WORKERS, len(devices))) as pool:
        return list(pool.map(work, devices))


def read_status(entry: FleetDevice, timeout_s: float = 10.0) -> DeviceStatus | str:
    """The device's status, or why it could not be read."""
    try:
        with connect(entry, timeout_s=timeout_s) as device:
            return device.status()
    except DeviceError as err:
        return str(err)


def device_state(device: FleetDevice) -> DeviceState:
    """What ``device`` runs, its staged version, lock, last deployment and gate result."""
    found = read_status(device)
    state = DeviceState(device.name, device.url, device.target, dict(device.labels), False)
    if isinstance(found, str):
        state.error = found
        return state
    state.reachable = True
    state.active, state.staged = _label(found.active), _label(found.staged)
    state.previous, state.locked = _label(found.previous), found.locked
    last = found.last
    if last is not None:
        state.last_state, state.last_version = last.state, last.label
        gate = last.step("gate")
        if gate is not None:
            measured = f", p99 {last.gate.p99_ms:.2f} ms" if last.gate is not None else ""
            runs = f", runs {last.variant}" if last.variant and gate.ok else ""
            state.gate = f"passed{measured}{runs}" if gate.ok else f"FAILED: {gate.detail}"
    return state


def fleet_status(fleet: str | Path, selectors: Sequence[str] = ()) -> list[DeviceState]:
    """Every selected device's state, read at once (an unreachable one says why)."""
    _, devices = load_selection(fleet, selectors)
    check_tokens(devices)
    return _each(devices, device_state)


def _befores(devices: Sequence[FleetDevice]) -> dict[str, DeviceStatus | str]:
    answers = _each(devices, read_status)
    return {d.name: a for d, a in zip(devices, answers, strict=True)}


# -- one device ----------------------------------------------------------------------------------


class _DeviceProgress:
    """One device's upload and agent steps as progress of the row named after the device."""

    def __init__(self, device: str) -> None:
        self.device, self.done = device, 0

    def started(self, stage: str, total: float | None, unit: str) -> None:
        BROADCAST.advanced(self.device, 0, f"{stage} ...")

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        BROADCAST.advanced(self.device, 0, f"{stage} {detail}")

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        self.done += 1
        BROADCAST.advanced(self.device, self.done, f"{stage}: {detail}")

    def said(self, stage: str, line: str) -> None:
        BROADCAST.said(self.device, f"{stage}: {line}")


@task(name="deploy_device", cache_policy=NO_CACHE, persist_result=False, log_prints=True)
def deploy_device(
    device: FleetDevice,
    wave: int,
    release_file: str,
    sha256: str,
    new: str,
    before: str | None,
    force: bool = False,
    timeout_s: float = 900.0,
) -> DeviceRollout:
    """The release onto one device of a wave. Never raises for the device's sake: an
    unreachable device, a refusal, a rollback or a timeout is the returned row's state."""
    start = time.perf_counter()
    row = DeviceRollout(device.name, wave, before, before, "failed")
    try:
        with connect(device, timeout_s=min(10.0, timeout_s)) as reached:
            reached.health()
    except DeviceError as err:
        row.state, row.reason = "unreachable", str(err)
    else:
        if before == new:
            row.state, row.reason = "active", "already ran this version"
            BROADCAST.advanced(device.name, len(STEPS), "already runs it")
        else:
            try:
                listener = _DeviceProgress(device.name)
                done = release.deploy_release(
                    device, Path(release_file), force, listener, timeout_s
                )
            except DeviceError as err:
                row.reason = str(err)
            except Exception as err:  # one device's fault fails that device, not the rollout
                row.reason = f"{type(err).__name__}: {err}"
            else:
                row.state, row.reason, row.deployment_id = done.state, done.reason, done.id
                row.p99_ms = done.gate.p99_ms if done.gate is not None else None
                if row.state == "active":
                    row.after = new
                    _tag_variant(device.name, new, done)
    row.seconds, row.at = time.perf_counter() - start, release.utc_stamp()
    print(f"{device.name} (wave {wave}): {row.state}{': ' + row.reason if row.reason else ''}")
    return row


def _tag_variant(device: str, new: str, done: Deployment) -> None:
    """What of the bundle runs on ``device`` and why (``precision: auto``), on the version
    ``new`` (``name:N``); a registry that cannot be tagged is said, not raised."""
    from mlflow.exceptions import MlflowException

    name, _, version = new.rpartition(":")
    try:
        registry.set_version_tags(name, version, release.variant_tags(device, done))
    except (registry.RegistryError, MlflowException) as err:
        print(f"{device}: could not tag {new} with its variant: {err}")


def _revert(device: FleetDevice, row: DeviceRollout, why: str) -> None:
    """Roll ``device`` back to what it ran before this rollout (its previous slot)."""
    try:
        with connect(device) as reached:
            reached.rollback()
            now = _label(reached.status().active)
    except DeviceError as err:
        row.reason = f"could not roll back: {err}"
        return
    row.after, row.state, row.at = now, "reverted", release.utc_stamp()
    row.reason = f"rolled back to {now}: {why}"
    if now != row.before:
        row.reason += f" (it ran {row.before} before)"


# -- the flow ------------------------------------------------------------------------------------


def plan(
    version: registry.VersionInfo,
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
    answers = _befores(devices)
    rows = []
    for number, wave in enumerate(waves):
        for device in wave:
            answer = answers[device.name]
            before = _label(answer.active) if not isinstance(answer, str) else None
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


@flow(
    name="deploy_fleet",
    log_prints=True,
    persist_result=False,
    task_runner=ThreadPoolTaskRunner(max_workers=FLEET_WORKERS),  # type: ignore[arg-type]
)
def deploy_fleet(
    version: registry.VersionInfo,
    fleet: str,
    canary: int | None = None,
    max_failures: int | None = None,
    select: list[str] | None = None,
    force: bool = False,
    key: str | None = None,
    max_parallel: int | None = None,
    pause_s: float | None = None,
    only: list[str] | None = None,
) -> FleetResult:
    """Roll a registry version out to a fleet: the canary, then the waves (see the module
    docstring).

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

    from pipelines.services import check_services, configure

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
    manifest, release_file = release.bundle_release(
        version, Path(key) if key else release.default_key()
    )
    from deploy_edge.release import file_sha256

    sha256, new = file_sha256(release_file), f"{manifest.model_name}:{manifest.model_version}"
    answers = _befores(devices)
    befores = {n: _label(a.active) if not isinstance(a, str) else None for n, a in answers.items()}
    for number, wave in enumerate(waves):
        for device in wave:
            BROADCAST.started(device.name, len(STEPS), "")
            BROADCAST.advanced(device.name, 0, f"wave {number}: waiting")
    rows: dict[str, DeviceRollout] = {}
    stopped, why = None, ""
    for number, wave in enumerate(waves):
        if number and policy.pause_s:
            print(f"pausing {policy.pause_s:g} s before wave {number}")
            time.sleep(policy.pause_s)
        step = max_parallel or len(wave)
        for first in range(0, len(wave), step):
            futures = [
                deploy_device.with_options(task_run_name=f"{device.name}-wave{number}").submit(
                    device,
                    number,
                    str(release_file),
                    sha256,
                    new,
                    befores[device.name],
                    force,
                    policy.device_timeout_s,
                )
                for device in wave[first : first + step]
            ]
            for device, future in zip(wave[first : first + step], futures, strict=True):
                rows[device.name] = row = future.result()
                _show(row)
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
    if stopped is not None:
        updated = [r for r in rows.values() if r.state == "active" and r.before != new]
        _each(
            [by_name[r.device] for r in updated],
            lambda d: _revert(d, rows[d.name], f"the rollout stopped at {why}"),
        )
        for row in updated:
            _show(row)
    ordered = []
    for number, wave in enumerate(waves):
        for device in wave:
            if device.name not in rows:
                before = befores[device.name]
                rows[device.name] = DeviceRollout(
                    device.name, number, before, before, "skipped", "the rollout stopped first"
                )
                _show(rows[device.name])
            ordered.append(rows[device.name])
    flow_run = get_run_context().flow_run  # type: ignore[union-attr]
    result = FleetResult(
        manifest.model_name,
        manifest.model_version,
        str(fleet),
        [[d.name for d in w] for w in waves],
        ordered,
        canary=canary_devices,
        stopped_at_wave=stopped,
        reason=why,
        flow_run_id=str(flow_run.id) if flow_run else "",
        seconds=time.perf_counter() - started,
        at=at,
    )
    record_rollout(result)
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
    registry.set_version_tags(result.model_name, result.model_version, tags)
    create_markdown_artifact(
        key=fleet_artifact_key(result.model_name),
        markdown=summary_markdown(result),
        description=f"fleet rollout of {new} ({result.fleet})",
    )


def _show(row: DeviceRollout) -> None:
    """A device's end on its progress row: green when it runs the new version."""
    p99 = f", p99 {row.p99_ms:.2f} ms" if row.p99_ms is not None else ""
    text = f"{row.state} ({row.after or '-'}{p99})"
    if row.state == "active":
        BROADCAST.finished(row.device, text, reused=False)
    else:
        style = "yellow" if row.state in ("reverted", "staged", "skipped") else "red"
        BROADCAST.advanced(row.device, 0, f"[{style}]{escape(f'{text}: {row.reason}')}")


__all__ = ["deploy_device", "deploy_fleet", "device_state", "fleet_status", "plan"]
