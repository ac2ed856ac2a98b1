"""Crash-safe files of the edge agent: an append-only JSON-lines journal, atomic symlink flips,
atomic file writes.

Each journal line is written, flushed and fsynced before the agent acts on it, so that after a
power loss or ``kill -9`` the journal says what was under way. A torn last line (the crash came
mid-write) is ignored when reading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


class Journal:
    """``path``: one JSON object per line, appended durably."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def append(self, event: dict[str, Any]) -> None:
        """Write ``event`` as one line; returns once it is on disk (flush + fsync)."""
        line = json_line(event)
        new = not self.path.exists()
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
        if new:
            fsync_dir(self.path.parent)

    def read(self) -> list[dict[str, Any]]:
        """Every complete event, oldest first (a torn or garbled line is skipped)."""
        return read_json_lines(self.path)


def json_line(data: dict[str, Any]) -> str:
    """``data`` as one compact JSON line (the journal's, the history's and a slot record's)."""
    return json.dumps(data, separators=(",", ":")) + "\n"


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of ``path``, one a line; lines that are not complete objects skipped."""
    if not path.is_file():
        return []
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict):
            events.append(event)
    return events


def fsync_dir(directory: Path) -> None:
    """Make renames and new entries in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def flip_link(link: Path, target: str | Path) -> None:
    """Point the symlink ``link`` at ``target`` atomically: the new link is made beside it and
    renamed over it, so a reader (or a crash) sees the old link or the new one, never none."""
    tmp = link.with_name(f".{link.name}.{os.getpid()}.tmp")
    if tmp.is_symlink() or tmp.exists():
        tmp.unlink()
    os.symlink(target, tmp)
    os.replace(tmp, link)
    fsync_dir(link.parent)


def remove_link(link: Path) -> None:
    """Remove the symlink ``link`` if it exists (durably)."""
    if link.is_symlink():
        link.unlink()
        fsync_dir(link.parent)


def write_atomic(path: Path, text: str) -> None:
    """Write ``path`` so that it holds the old content or all of ``text``, never a part."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)
