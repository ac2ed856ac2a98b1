"""One device of a fleet: its status read, the release deployed onto it (the ``deploy_device``
task: upload, then the agent's steps through activation and the health gate), its variant
tagged, its rollback, and its progress row.

What is done to one device, whatever rollout or follow-up asks for it: the ``deploy_fleet``
flow (:mod:`pipelines.deploy.fleet`) runs :func:`deploy_device` once per device of a wave
and :func:`revert` on what it updated when it stops; the follow-ups
(:mod:`pipelines.deploy.followups`) revert the devices of a killed rollout with the same
:func:`revert`, and ``fleet rollback`` returns each device with :func:`roll_back_to`, which
refuses when the previous slot holds another version.

Devices are reached through :func:`deploy_edge.device.connect` (whatever their kind) and
answer with the records of :mod:`deploy_edge.wire`. Per-device progress goes to this
process's listeners (:func:`pipelines.progress.listening`): one row per device, named after
it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.states import Failed, State
from rich.markup import escape

from deploy_edge.device import DeviceError, DeviceRefused, DeviceUnreachable, connect
from deploy_edge.fleet import FleetDevice
from deploy_edge.wire import STEPS as DEVICE_STEPS
from deploy_edge.wire import Origin
from pipelines.deploy import release
from pipelines.progress import BROADCAST
from pipelines.records import DeviceRollout, DeviceState
from pipelines.registry.versions import RegistryError, set_version_tags

if TYPE_CHECKING:
    from deploy_edge.wire import Deployment, DeviceStatus, Slot

T = TypeVar("T")


STEPS = ("upload", *DEVICE_STEPS)
"""The steps of one device's deployment (its progress bar)."""
FLEET_WORKERS = 64
"""Most devices of one wave deployed at once."""


# -- reading devices -----------------------------------------------------------------------------


def label_of(slot: Slot | None) -> str | None:
    """The ``model:version`` a slot holds (None: an empty slot)."""
    return slot.label if slot is not None else None


def each_device(devices: Sequence[FleetDevice], work: Callable[[FleetDevice], T]) -> list[T]:
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
    state.active, state.staged = label_of(found.active), label_of(found.staged)
    state.previous, state.locked = label_of(found.previous), found.locked
    last = found.last
    if last is not None:
        state.last_state, state.last_version = last.state, last.label
        gate = last.step("gate")
        if gate is not None:
            measured = f", p99 {last.gate.p99_ms:.2f} ms" if last.gate is not None else ""
            runs = f", runs {last.variant}" if last.variant and gate.ok else ""
            state.gate = f"passed{measured}{runs}" if gate.ok else f"FAILED: {gate.detail}"
    return state


def read_statuses(devices: Sequence[FleetDevice]) -> dict[str, DeviceStatus | str]:
    """Each device's status by name, read at once (or why it could not be read)."""
    answers = each_device(devices, read_status)
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
    runs_it: bool,
    force: bool = False,
    timeout_s: float = 900.0,
    origin: Origin | None = None,
) -> DeviceRollout | State[DeviceRollout]:
    """The release onto one device of a wave (``runs_it``: the device runs it already,
    :func:`~pipelines.deploy.release.runs_release`; nothing is sent). Never raises for the
    device's sake: an unreachable device, a refusal, a rollback or a timeout is the row's
    state, and the task run ends Failed with the row as its data
    (``future.result(raise_on_failure=False)``)."""
    start = time.perf_counter()
    row = DeviceRollout(device.name, wave, before, before, "failed")
    try:
        with connect(device, timeout_s=min(10.0, timeout_s)) as reached:
            reached.health()
    except DeviceError as err:
        row.state, row.reason = "unreachable", str(err)
    else:
        if runs_it:  # release.runs_release: the same version with the same content
            row.state, row.reason = "active", "already ran this version"
            BROADCAST.advanced(device.name, len(STEPS), "already runs it")
        else:
            try:
                listener = _DeviceProgress(device.name)
                done, sent = release.deploy_release(
                    device, Path(release_file), force, listener, timeout_s, origin=origin
                )
            except DeviceError as err:
                row.reason = str(err)
            except Exception as err:  # one device's fault fails that device, not the rollout
                row.reason = f"{type(err).__name__}: {err}"
            else:
                row.state, row.reason, row.deployment_id = done.state, done.reason, done.id
                row.p99_ms = done.gate.p99_ms if done.gate is not None else None
                row.sent_bytes = sent.sent
                if row.state == "active":
                    row.after = new
                    _tag_variant(device.name, new, done)
    row.seconds, row.at = time.perf_counter() - start, release.utc_stamp()
    print(f"{device.name} (wave {wave}): {row.state}{': ' + row.reason if row.reason else ''}")
    if row.state in ("active", "staged"):
        return row
    return Failed(message=f"{row.state}: {row.reason}", data=row)  # the row stays readable


def _tag_variant(device: str, new: str, done: Deployment) -> None:
    """What of the bundle runs on ``device`` and why (``precision: auto``), on the version
    ``new`` (``name:N``); a registry that cannot be tagged is said, not raised."""
    from mlflow.exceptions import MlflowException

    name, _, version = new.rpartition(":")
    try:
        set_version_tags(name, version, release.variant_tags(device, done))
    except (RegistryError, MlflowException) as err:
        print(f"{device}: could not tag {new} with its variant: {err}")


def revert(device: FleetDevice, row: DeviceRollout, why: str, origin: Origin | None = None) -> None:
    """Roll ``device`` back to what it ran before this rollout (its previous slot);
    ``origin``: the rollout, recorded in the device's history."""
    try:
        with connect(device) as reached:
            reached.rollback(origin=origin)
            now = label_of(reached.status().active)
    except DeviceError as err:
        row.reason = f"could not roll back: {err}"
        return
    row.after, row.state, row.at = now, "reverted", release.utc_stamp()
    row.reason = f"rolled back to {now}: {why}"
    if now != row.before:
        row.reason += f" (it ran {row.before} before)"


def roll_back_to(
    device: FleetDevice, done: DeviceRollout, label: str, origin: Origin
) -> DeviceRollout:
    """``device`` back to ``done.before`` (its row of a rollout of ``label``) when its previous
    slot holds it (``fleet rollback``): the new row says ``reverted``, ``refused`` (it runs
    something else, or its previous slot does not hold ``before``), ``unreachable`` or
    ``failed``."""
    before = done.before
    row = DeviceRollout(device.name, done.wave, label, None, "failed")
    try:
        with connect(device) as reached:
            status = reached.status()
            now = status.active.label if status.active else None
            previous = status.previous.label if status.previous else None
            row.before = row.after = now
            if now == before:
                row.state, row.reason = "reverted", f"already ran {before}"
            elif now == label and previous == before:
                reached.rollback(origin=origin)
                after = reached.status().active
                row.after = after.label if after else None
                row.state, row.reason = "reverted", f"rolled back to {row.after}"
            else:
                # Never guess: rolling back to whatever the previous slot holds could activate
                # a version nobody asked for.
                row.state = "refused"
                row.reason = (
                    f"runs {now or 'nothing'}, previous {previous or 'none'}: not the "
                    f"rollout's {label} over {before or 'nothing'}; redeploy {before} with "
                    f"robo-pipe deploy --device (--force past the release floor)"
                )
    except DeviceUnreachable as err:
        row.state, row.reason = "unreachable", str(err)
    except DeviceRefused as err:
        row.state, row.reason = "refused", str(err)
    except DeviceError as err:
        row.reason = str(err)
    row.at = release.utc_stamp()
    return row


def show_row(row: DeviceRollout) -> None:
    """A device's end on its progress row: green when it runs the new version."""
    p99 = f", p99 {row.p99_ms:.2f} ms" if row.p99_ms is not None else ""
    text = f"{row.state} ({row.after or '-'}{p99})"
    if row.state == "active":
        BROADCAST.finished(row.device, text, reused=False)
    else:
        style = "yellow" if row.state in ("reverted", "staged", "skipped") else "red"
        BROADCAST.advanced(row.device, 0, f"[{style}]{escape(f'{text}: {row.reason}')}")


__all__ = [
    "FLEET_WORKERS",
    "STEPS",
    "deploy_device",
    "device_state",
    "each_device",
    "label_of",
    "read_status",
    "read_statuses",
    "revert",
    "roll_back_to",
    "show_row",
]
