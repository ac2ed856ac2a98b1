"""The agent's state directory as the deployer sees it: three links and the slots they point to.

    active, previous, staged           symlinks to slots/<name>/<bundle>
    slots/<name>/, slots/<name>.json   an extracted release and its :class:`Slot` record

A link flips atomically (:func:`deploy_edge.agent.journal.flip_link`); a slot no link points to
is garbage, removed at the end of every deployment and at start.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from deploy_edge.agent.config import DeviceConfigError
from deploy_edge.agent.journal import flip_link, json_line, remove_link, write_atomic
from deploy_edge.wire import Slot

LINKS = ("active", "previous", "staged")
"""The links of the state directory: what runs, what a rollback returns to, what waits for the
robot-busy lock to go."""


class SlotStore:
    """The links and slots under ``state_dir`` (absolute), created if missing;
    :class:`~deploy_edge.agent.config.DeviceConfigError` if it cannot hold them."""

    def __init__(self, state_dir: Path) -> None:
        self.state_dir = state_dir
        self.slots_dir = state_dir / "slots"
        try:
            self.slots_dir.mkdir(parents=True, exist_ok=True)
            if not os.access(state_dir, os.R_OK | os.W_OK | os.X_OK):
                raise PermissionError("not readable and writable by this user")
        except OSError as err:  # a state it cannot see: never start as if it were fresh
            raise DeviceConfigError(
                f"field 'state_dir' = '{state_dir}': cannot hold the agent's state "
                f"({type(err).__name__}: {err})"
            ) from err

    def target(self, link: str) -> str | None:
        """The absolute bundle path ``state_dir/<link>`` points to (None: no such link)."""
        path = self.state_dir / link
        if not path.is_symlink():
            return None
        return os.path.normpath(self.state_dir / os.readlink(path))

    def links(self) -> dict[str, str | None]:
        """Every link's bundle path (None: the link does not exist)."""
        return {name: self.target(name) for name in LINKS}

    def set_links(self, links: dict[str, str | None]) -> None:
        """Point the named links at bundle paths (None: remove the link), each atomically."""
        for name, target in links.items():
            link = self.state_dir / name
            if target is None:
                remove_link(link)
            else:
                flip_link(link, os.path.relpath(target, self.state_dir))

    def restore(self, before: dict[str, str | None] | None, slot: str | None) -> list[str]:
        """Put the links back as ``before`` (a staged link to ``slot`` is dropped); returns what
        changed."""
        if before is None:
            return []
        wanted = {k: (None if k == "staged" and v == slot else v) for k, v in before.items()}
        now = self.links()
        changed = [k for k in LINKS if now.get(k) != wanted.get(k)]
        self.set_links({k: wanted.get(k) for k in changed})
        return changed

    def slot_name(self, bundle: str) -> str | None:
        """The slot directory (under ``slots/``) holding ``bundle``."""
        rel = Path(os.path.relpath(bundle, self.slots_dir))
        return rel.parts[0] if rel.parts and rel.parts[0] not in ("..", ".") else None

    def referenced(self) -> set[str]:
        """The slots some link points to."""
        names = (self.slot_name(t) for t in self.links().values() if t is not None)
        return {n for n in names if n is not None}

    def slot(self, link: str) -> Slot | None:
        """The slot ``link`` points to, with its path as it is now (None: no link, no record)."""
        target = self.target(link)
        name = self.slot_name(target) if target else None
        slot = self.read(name) if name else None
        if slot is not None and target is not None:
            slot.path = target  # where it is now (a state directory may have moved)
        return slot

    def read(self, name: str) -> Slot | None:
        """The record ``slots/<name>.json`` (None: missing or unreadable)."""
        try:
            return Slot.from_json(json.loads((self.slots_dir / f"{name}.json").read_text()))
        except (OSError, ValueError):  # RecordError and JSONDecodeError are ValueErrors
            return None

    def write(self, name: str, slot: Slot) -> None:
        """Write the record ``slots/<name>.json`` atomically."""
        write_atomic(self.slots_dir / f"{name}.json", json_line(slot.to_json()))

    def records(self) -> list[Slot]:
        """Every readable slot record on the device, linked or not."""
        found = (self.read(record.stem) for record in self.slots_dir.glob("*.json"))
        return [slot for slot in found if slot is not None]

    def collect_garbage(self) -> list[str]:
        """Remove dangling links, temporary files and every slot no link points to."""
        notes = []
        for name in LINKS:
            link = self.state_dir / name
            if link.is_symlink() and not link.exists():
                remove_link(link)
                notes.append(f"removed the dangling link {name}")
        for tmp in self.state_dir.glob(".*.tmp"):
            remove_path(tmp)
        keep = self.referenced()
        for entry in sorted(self.slots_dir.iterdir()):
            if entry.name.removesuffix(".json") not in keep:
                remove_path(entry)
                if entry.suffix != ".json":
                    notes.append(f"removed slots/{entry.name} (not active, previous or staged)")
        return notes


def remove_path(path: Path) -> None:
    """Remove a file, a link or a directory tree, whichever ``path`` is (nothing if absent)."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    elif path.is_dir():
        shutil.rmtree(path)
