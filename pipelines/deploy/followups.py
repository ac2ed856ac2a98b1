"""After a fleet rollout, from its record (:mod:`pipelines.deploy.rollouts`): which devices a
retry or a resume deploys, and a fleet rolled back to what it ran before the rollout.

- ``robo-pipe deploy MODEL --fleet F --retry-failed ID`` (:func:`retry_devices`): only the
  devices that do not run the version in that rollout's record: refused, unreachable, failed,
  reverted, skipped, and any device of its waves it never reached (it was killed first).
- ``robo-pipe deploy MODEL --fleet F --resume ID`` (:func:`resume_devices`): a rollout that
  ended without finishing (incomplete, stopped, cancelled, reconciled, or killed) goes on over the
  devices its selection picks, less those its record has on the version; a device found on
  the version when its turn comes is not deployed again (``deploy_device``). A completed
  rollout, or one whose process still runs, is not resumed.

Both run a new rollout (its own record, flow run and canary) of the same version over those
devices: MODEL and the fleet file must be the record's (a mismatch is bad input).

- ``robo-pipe fleet rollback F --rollout ID`` (:func:`rollback_fleet`): every device the
  rollout put on its version goes back to what it ran before (its record's ``before``), by the
  agent's rollback when that is the device's previous slot (the agent records the rollout's
  id as the action's origin); a device already back on it is left alone; one whose previous
  slot is something else is refused with the redeploy to run, never guessed at. The version's
  device tags say ``reverted`` where it worked.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from deploy_edge.device import DeviceError, DeviceRefused, DeviceUnreachable, connect
from deploy_edge.fleet import FleetDevice, load_selection
from deploy_edge.wire import Origin
from pipelines.deploy.rollouts import RolloutRecord, is_dead
from pipelines.records import DeviceRollout
from robo_pipe.errors import InputError

RESUMABLE = ("incomplete", "stopped", "cancelled", "reconciled")
"""Record states a rollout can be resumed from (and ``running`` when its process is gone)."""


def check_same_rollout(record: RolloutRecord, fleet: str | Path, label: str | None) -> None:
    """Raise :class:`InputError` unless ``record`` rolled out ``label`` (``model:version``;
    None: any) to the fleet file ``fleet``."""
    if Path(record.fleet).resolve() != Path(fleet).resolve():
        raise InputError(f"rollout {record.id} was to {record.fleet}, not {fleet}")
    if label is not None and label != record.label:
        raise InputError(
            f"rollout {record.id} rolled out {record.label}, not {label}: give that version"
        )


def retry_devices(record: RolloutRecord) -> list[str]:
    """Names of the devices ``record`` did not leave on its version (its failed rows, and the
    devices of its waves it never reached), in wave order."""
    failed = {r.device for r in record.failed()}
    touched = {r.device for r in record.devices}
    planned = [name for wave in record.waves for name in wave]
    ordered = planned + [r.device for r in record.devices if r.device not in planned]
    return [n for n in ordered if n in failed or n not in touched]


def resume_devices(record: RolloutRecord) -> list[str]:
    """Names of the devices a resume of ``record`` deploys: its selection less the devices it
    has on its version. :class:`InputError` when it cannot be resumed (it completed, or its
    process still runs)."""
    if record.state == "completed":
        raise InputError(f"rollout {record.id} completed: nothing to resume")
    if record.state not in RESUMABLE and not is_dead(record):
        raise InputError(
            f"rollout {record.id} is still running (pid {record.pid} on {record.host}): "
            "stop it (Ctrl-C) before resuming it"
        )
    _, devices = load_selection(record.fleet, record.selectors)
    done = {r.device for r in record.devices if r.state in ("active", "staged")}
    if record.state == "running":
        # Its process is gone: the reconciliation that runs before the new rollout reverts
        # what it updated, so none of its devices is done.
        done = set()
    return [d.name for d in devices if d.name not in done]


def rollback_fleet(
    record: RolloutRecord, selectors: Sequence[str] = (), flow_run: str = ""
) -> list[DeviceRollout]:
    """Every device ``record`` put on its version (of those ``selectors`` pick in its fleet
    file) back to what it ran before, and the version's device tags updated. One row per
    device: ``reverted`` (it runs ``before`` now, or already did), ``refused`` (its previous
    slot is not ``before``: the reason says what to redeploy), ``unreachable``, ``failed``."""
    from pipelines.deploy import release
    from pipelines.registry.versions import set_version_tags

    _, devices = load_selection(record.fleet, selectors)
    by_name = {d.name: d for d in devices}
    origin = Origin(by="fleet", rollout=record.id, flow_run=flow_run)
    rows = [
        _roll_back(by_name[row.device], row, record.label, origin)
        for row in record.updated()
        if row.device in by_name
    ]
    tags: dict[str, str] = {}
    for row in rows:
        if row.state == "reverted":
            tags |= release.device_tags(
                row.device, version=row.after or "none", state="reverted", at=row.at
            )
    if tags:
        set_version_tags(record.model_name, record.model_version, tags)
    return rows


def _roll_back(
    device: FleetDevice, done: DeviceRollout, label: str, origin: Origin
) -> DeviceRollout:
    """``device`` back to ``done.before`` when its previous slot holds it."""
    from pipelines.deploy import release

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


__all__ = ["check_same_rollout", "resume_devices", "retry_devices", "rollback_fleet"]
