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

- Every fleet command first (:func:`reconcile_rollouts`): a rollout whose process was killed
  (SIGKILL, a power cut) has the devices it updated rolled back, the version tagged
  ``reverted`` there, and its record marked ``reconciled``.

What is done to one device (read, revert, roll back) is :mod:`pipelines.deploy.device_steps`,
imported inside the functions that need it: the CLI loads this module to check its input before
Prefect or MLflow is loaded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from deploy_edge.fleet import FleetDevice, FleetError, load_fleet, load_selection
from deploy_edge.wire import Origin
from pipelines.deploy import rollouts
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
    from pipelines.deploy.device_steps import roll_back_to
    from pipelines.registry.versions import set_version_tags

    _, devices = load_selection(record.fleet, selectors)
    by_name = {d.name: d for d in devices}
    origin = Origin(by="fleet", rollout=record.id, flow_run=flow_run)
    rows = [
        roll_back_to(by_name[row.device], row, record.label, origin)
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


# -- rollouts whose process died -----------------------------------------------------------------


def reconcile_rollouts() -> list[str]:
    """Repair every rollout whose record says ``running`` but whose process is gone (killed
    with SIGKILL, a power cut): each device it may have updated (``active`` or ``deploying``
    in the record) that runs its version is rolled back to what it ran before, by its agent;
    the version's tags say ``reverted`` there; its Prefect flow run, if a configured server
    answers, is marked Crashed (no server is started for it); the record becomes
    ``reconciled``. Returns one line per device, ``repaired ...`` or ``not repaired yet: ...``
    (one ``repaired ...`` line for a rollout that had updated none), each pass's lines also
    kept in the record's ``repaired``; none: nothing was dead. A device it cannot repair
    leaves the record ``running`` so that the next fleet command tries again."""
    lines = []
    for record in rollouts.dead():
        lines.extend(_reconcile(record))
    return lines


def _reconcile(record: RolloutRecord) -> list[str]:
    from pipelines.deploy import release

    who = f"rollout {record.id} ({record.label}, pid {record.pid} gone)"
    try:
        parsed = load_fleet(record.fleet)
    except FleetError as err:
        return [f"not repaired yet: {who}: cannot read its fleet file: {err}"]
    by_name = {d.name: d for d in parsed.devices}
    lines, left = [], False
    for row in record.updated():
        done, what = _repair_device(record, by_name.get(row.device), row)
        left = left or not done
        lines.append(f"{'repaired' if done else 'not repaired yet:'} {who}: {what}")
    if not lines:
        lines = [f"repaired {who}: no device had taken {record.label}; marked reconciled"]
    # Every pass's lines stay on record: a device repaired by an earlier pass is not in this
    # one's (its row says reverted now).
    stamp = release.utc_stamp()
    record.repaired += [f"{stamp}: {line}" for line in lines]
    if not left:
        _mark_crashed(record)
        record.state, record.ended = "reconciled", stamp
        record.reason = f"its process {record.pid} died; reconciled by pid {os.getpid()}"
    rollouts.save(record)
    return lines


def _repair_device(
    record: RolloutRecord, entry: FleetDevice | None, row: DeviceRollout
) -> tuple[bool, str]:
    """Roll back one device ``record`` may have updated, talking to its agent: whether it
    needs nothing more, and the one line that says what was done (``row`` is updated)."""
    from pipelines.deploy import release
    from pipelines.deploy.device_steps import label_of, read_status, revert
    from pipelines.registry.versions import RegistryError, set_version_tags

    if entry is None:
        return False, f"{row.device}: no longer in {record.fleet}"
    found = read_status(entry)
    if isinstance(found, str):
        return False, f"{row.device}: unreachable ({found})"
    if found.running is not None:  # the agent goes on after the rollout died: wait
        return False, f"{row.device}: a deployment is still running there"
    now = label_of(found.active)
    if now != record.label:
        row.after = now
        row.state, row.reason = "skipped", f"found on {now or 'nothing'}: not updated"
        return True, f"{row.device} found on {now or 'nothing'}: it had not taken {record.label}"
    origin = Origin(by="fleet", rollout=record.id, flow_run=record.flow_run_url)
    revert(entry, row, f"rollout {record.id} was killed", origin)
    if row.state != "reverted":
        return False, f"{row.device}: {row.reason}"
    what = f"{row.device} rolled back from {record.label} to {row.after}"
    tags = release.device_tags(row.device, version=row.after or "none", state="reverted", at=row.at)
    try:
        set_version_tags(record.model_name, record.model_version, tags)
    except RegistryError as err:
        return False, f"{what}; could not tag {record.label}: {err}"
    return True, what


def _mark_crashed(record: RolloutRecord) -> None:
    """Its Prefect flow run ``Crashed`` (it says ``Running`` forever otherwise), if a Prefect
    server is configured (``robo-pipe ui``'s or ``PREFECT_API_URL``) and answers; else left
    as it is. Without one, Prefect's client would start a temporary server (10-15 s, its log
    on stderr) that cannot hold the flow run anyway: it lived on the dead process's own."""
    from pipelines.services.settings import configure

    if not record.flow_run_id or configure(create=False).prefect_api_url is None:
        return
    from uuid import UUID

    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    message = f"process {record.pid} ended without reporting (killed?); rollout reconciled"
    try:
        with get_client(sync_client=True) as prefect:
            prefect.set_flow_run_state(UUID(record.flow_run_id), Crashed(message=message))
    except Exception:  # another server than the rollout's: the record says reconciled
        return


__all__ = [
    "check_same_rollout",
    "reconcile_rollouts",
    "resume_devices",
    "retry_devices",
    "rollback_fleet",
]
