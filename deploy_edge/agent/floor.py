"""The device's release floor: the highest release of each model it ever installed.

A release below its model's floor installs only with ``force`` (the deployment records it as
forced past the floor); a manual rollback to a slot still on the device does not lower it, so
"roll back, then install an older genuine release" needs ``force`` too. The floor lives in
``state_dir/floor.json`` (written atomically and fsynced, like the journal), so it survives a
restart.

Lost state is reported, never silently reset: :meth:`ReleaseFloor.load` returns a notice (the
agent logs it at start and shows it in its status) when the state directory did not exist, or
when a state directory that has deployed before holds no floor record or an unreadable one. The
floor is then rebuilt from what is left (the releases the history says went live and those of
the slots on the device) and the notice says so; the file is rewritten at the next install, so
the notice stays until then.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from deploy_edge.agent.history import History
from deploy_edge.agent.journal import write_atomic
from deploy_edge.agent.slots import SlotStore
from robo_pipe.records import Record

FLOOR_FILE = "floor.json"
"""Under the state directory."""


@dataclass
class FloorRecord(Record):
    """``floor.json``."""

    releases: dict[str, int] = field(default_factory=dict)
    """Model name -> the highest release of it this device installed (went live)."""
    updated_at: str = ""
    """When it last rose: ISO 8601, UTC."""


class ReleaseFloor:
    """The floor of one state directory (see the module docstring)."""

    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / FLOOR_FILE
        self.releases: dict[str, int] = {}

    def load(self, state_dir_existed: bool, installed: dict[str, int]) -> str:
        """Read the floor; returns a notice ("" when all is well). ``state_dir_existed``:
        whether the state directory was there before the agent made it; ``installed``: model
        name -> highest release the rest of the state shows installed (empty: a fresh state)."""
        if not state_dir_existed:
            return (
                f"state directory {self.path.parent} did not exist and was created empty: no "
                "release floor (on a first start that is expected; otherwise the device's "
                "state was lost and an older release would install without force)"
            )
        try:
            self.releases = FloorRecord.from_json(json.loads(self.path.read_text())).releases
            return ""
        except FileNotFoundError:
            problem = "is missing"
        except (OSError, ValueError) as err:  # RecordError and JSONDecodeError are ValueErrors
            problem = f"is unreadable ({type(err).__name__}: {err})"
        if not installed:
            return ""  # a fresh state directory: nothing installed, nothing lost
        self.releases = dict(installed)
        rebuilt = ", ".join(f"{m} {r}" for m, r in sorted(installed.items()))
        return (
            f"release floor {self.path} {problem} although this device has deployed before: "
            f"rebuilt from its history and slots ({rebuilt}); a release installed since the "
            "last record may be missing from it"
        )

    def of(self, model_name: str) -> int | None:
        """The floor of ``model_name`` (None: none of it installed)."""
        return self.releases.get(model_name)

    def raise_to(self, model_name: str, release: int) -> None:
        """Record that ``release`` of ``model_name`` was installed (a lower one changes
        nothing); on disk before it returns."""
        if release <= self.releases.get(model_name, -1) and self.path.is_file():
            return
        self.releases[model_name] = max(release, self.releases.get(model_name, release))
        record = FloorRecord(dict(self.releases), datetime.now(UTC).isoformat(timespec="seconds"))
        write_atomic(self.path, json.dumps(record.to_json(), indent=2) + "\n")


def installed_releases(history: History, slots: SlotStore) -> dict[str, int]:
    """Model name -> the highest release the history says went live or a slot on the device
    holds (what a lost floor record is rebuilt from)."""
    releases = [(d.model_name, d.release) for d in history.deployments() if d.state == "active"]
    releases += [(slot.model_name, slot.release) for slot in slots.records()]
    installed: dict[str, int] = {}
    for model, release in releases:
        installed[model] = max(release, installed.get(model, release))
    return installed
