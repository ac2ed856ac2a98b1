"""Rollout records: one JSON file per fleet rollout, so a stopped or killed rollout can be
found, repaired, retried or resumed.

``$ROBO_PIPE_HOME/rollouts/<id>.json`` holds a :class:`RolloutRecord`. ``deploy_fleet`` writes
it (atomically: written beside, then renamed) when the rollout starts, when a device's
deployment starts (its row in state ``deploying``), after each device ends, after a revert and
at the end. Readers (``--retry-failed``, ``--resume``, ``fleet rollback``, the reconciler) only
ever see a whole file.

The interface other modules use:

- :func:`new_record` — the record of a rollout starting now in this process (``state`` =
  ``running``, this process's pid and start time).
- :func:`save` — write it (atomic); :func:`load` — read one by id (:class:`RolloutError` if
  there is none: a user's mistake); :func:`all_records` — every record, oldest first;
  :func:`latest` — the newest record of a fleet file (optionally in one state).
- :func:`is_dead` / :func:`dead` — a ``running`` record whose process is gone (killed with
  SIGKILL, a power cut): ``pipelines.deploy.followups.reconcile_rollouts`` reverts what it
  updated.
- :meth:`RolloutRecord.updated` — the devices the rollout may have put on the new version
  (state ``active`` or ``deploying`` with a ``before`` other than the new version): what a
  revert or a ``fleet rollback`` must return to ``before``.
- :meth:`RolloutRecord.failed` — the devices ``--retry-failed`` redeploys (every state but
  ``active``/``staged``: refused, unreachable, failed, reverted, skipped, ...).

A record's ``state``: ``running`` (its process is at work, or died: see :func:`is_dead`),
``completed`` (every device runs the version), ``incomplete`` (it went through, some device
does not run the version: unreachable, refused within the allowed failures), ``stopped`` (a
wave failed; what it updated was rolled back), ``cancelled`` (SIGINT/SIGTERM; what it updated
was rolled back),
``reconciled`` (found dead by a later fleet command, which rolled back what it updated).
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.home import home_dir, home_path
from pipelines.records import DeviceRollout
from robo_pipe.errors import InputError
from robo_pipe.records import Record, RecordError

ROLLOUTS = "rollouts"
"""Folder of the home that holds the records."""
FINAL_STATES = ("completed", "incomplete", "stopped", "cancelled", "reconciled")
"""States of a rollout that has ended (anything else is ``running``)."""


class RolloutError(InputError):
    """A rollout id that names no record (a user's mistake: exit 2)."""


@dataclass
class RolloutRecord(Record):
    """One fleet rollout as it goes (see the module docstring)."""

    id: str
    """``<UTC yyyymmddThhmmss>-<6 hex>``: sortable by start, unique."""
    model_name: str
    model_version: str
    fleet: str
    """The fleet file, as given."""
    selectors: list[str]
    state: str
    """``running``, ``completed``, ``incomplete``, ``stopped``, ``cancelled`` or
    ``reconciled``."""
    pid: int
    host: str
    process_start: int | None
    """The process's start (``/proc/<pid>/stat`` field 22): with the pid, it names one process
    even after the pid is reused."""
    started: str
    """UTC time the rollout started."""
    devices: list[DeviceRollout] = field(default_factory=list)
    """Every device touched so far, in the order it started (``deploying`` while in flight)."""
    waves: list[list[str]] = field(default_factory=list)
    flow_run_id: str = ""
    flow_run_url: str = ""
    reason: str = ""
    """Why it stopped, was cancelled or reconciled."""
    ended: str = ""
    repaired: list[str] = field(default_factory=list)
    """What reconciliation did, one line per device per pass, each pass's lines kept and
    stamped with its UTC time (a device repaired by a later pass has a line of each)."""

    @property
    def label(self) -> str:
        """``model:version`` being rolled out."""
        return f"{self.model_name}:{self.model_version}"

    def row(self, device: str) -> DeviceRollout | None:
        """The device's row, if it was touched."""
        return next((r for r in self.devices if r.device == device), None)

    def put(self, row: DeviceRollout) -> None:
        """Add or replace the device's row."""
        self.devices = [r for r in self.devices if r.device != row.device] + [row]

    def updated(self) -> list[DeviceRollout]:
        """Rows of devices this rollout may have moved to the new version (``active``, or
        ``deploying`` when its process died mid-step: the device may or may not run it)."""
        return [
            r for r in self.devices if r.state in ("active", "deploying") and r.before != self.label
        ]

    def failed(self) -> list[DeviceRollout]:
        """Rows of devices that do not run the new version (what ``--retry-failed`` redeploys)."""
        return [r for r in self.devices if r.state not in ("active", "staged")]


def rollouts_dir() -> Path:
    """``$ROBO_PIPE_HOME/rollouts`` (created)."""
    return home_dir(ROLLOUTS)


def new_record(
    model_name: str, model_version: str, fleet: str, selectors: list[str]
) -> RolloutRecord:
    """The record of a rollout starting now in this process (not yet saved)."""
    from pipelines.services.processes import process_start

    now = time.gmtime()
    return RolloutRecord(
        id=f"{time.strftime('%Y%m%dT%H%M%S', now)}-{uuid.uuid4().hex[:6]}",
        model_name=model_name,
        model_version=model_version,
        fleet=fleet,
        selectors=list(selectors),
        state="running",
        pid=os.getpid(),
        host=socket.gethostname(),
        process_start=process_start(os.getpid()),
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", now),
    )


def save(record: RolloutRecord) -> Path:
    """Write ``record`` (beside, then renamed: a reader never sees half a file)."""
    path = rollouts_dir() / f"{record.id}.json"
    staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
    staging.write_text(json.dumps(record.to_json(), indent=1))
    staging.replace(path)
    return path


def load(rollout_id: str) -> RolloutRecord:
    """The record named ``rollout_id`` (:class:`RolloutError` when there is none)."""
    path = home_path(ROLLOUTS) / f"{rollout_id}.json"
    if "/" in rollout_id or not path.is_file():
        known = [r.id for r in all_records()[-5:]]
        hint = f" (latest: {', '.join(known)})" if known else " (none recorded yet)"
        raise RolloutError(f"no rollout {rollout_id!r} in {path.parent}{hint}")
    return _read(path)


def _read(path: Path) -> RolloutRecord:
    try:
        return RolloutRecord.from_json(json.loads(path.read_text()))
    except (ValueError, RecordError) as err:
        raise RolloutError(f"rollout record {path} is unreadable: {err}") from err


def all_records() -> list[RolloutRecord]:
    """Every readable record, oldest first (an unreadable one is skipped). Reads only: a
    home without records is not created (``fleet status`` is a read-only verb)."""
    found = []
    for path in sorted(home_path(ROLLOUTS).glob("*.json")):
        try:
            found.append(_read(path))
        except RolloutError:
            continue
    return found


def latest(fleet: str | Path, state: str | None = None) -> RolloutRecord | None:
    """The newest record of the fleet file ``fleet`` (same resolved path), if any; with
    ``state``, the newest in that state (``completed``: the version the fleet was last put
    on, what ``fleet status`` expects by default)."""
    want = Path(fleet).resolve()
    mine = [
        r
        for r in all_records()
        if Path(r.fleet).resolve() == want and (state is None or r.state == state)
    ]
    return mine[-1] if mine else None


def dead() -> list[RolloutRecord]:
    """Every record whose rollout's process died while running (:func:`is_dead`)."""
    return [r for r in all_records() if is_dead(r)]


def is_dead(record: RolloutRecord) -> bool:
    """``record`` says ``running`` but its process (on this host) is gone."""
    from pipelines.services.processes import process_start

    if record.state in FINAL_STATES or record.host != socket.gethostname():
        return False
    now = process_start(record.pid)
    return now is None or (record.process_start is not None and now != record.process_start)


__all__ = [
    "RolloutError",
    "RolloutRecord",
    "all_records",
    "dead",
    "is_dead",
    "latest",
    "load",
    "new_record",
    "rollouts_dir",
    "save",
]
