"""Resuming pipeline runs: records of completed stages, keyed on what each stage was given.

A stage's key hashes its inputs (the upstream records it consumed, the config sections that
determine its result, the code version). When a stage completes, its output record is written
atomically to ``$ROBO_PIPE_HOME/stages/<stage>-<key>.json``; a failed stage writes nothing.
A later run with the same inputs finds the record and, if the artifact it points to is still
intact (the stage's ``check``), reuses it instead of running the stage again. So re-running a
failed or killed pipeline continues from the stage that did not finish.

Paths inside the home are kept as ``$ROBO_PIPE_HOME/...`` in both the key and the record
(:func:`robo_pipe.home.mark_home`): a home moved or copied elsewhere reuses its records,
and they point into the home they are read in.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from robo_pipe.home import mark_home, unmark_home
from robo_pipe.records import Record, RecordError

R = TypeVar("R", bound=Record)


def stage_key(stage: str, inputs: dict[str, Any]) -> str:
    """sha256 (16 hex digits) of the stage name and the canonical JSON of ``inputs`` (the
    home's own path in it written as ``$ROBO_PIPE_HOME``: the key is the same wherever the home
    is)."""
    canonical = mark_home(json.dumps({"stage": stage, **inputs}, sort_keys=True, default=str))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class StageRecords:
    """Completed-stage records under one directory (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def path(self, stage: str, key: str) -> Path:
        """The record file of ``stage`` with inputs ``key``."""
        return self.root / f"{stage}-{key}.json"

    def get(self, stage: str, key: str, kind: type[R], check: Callable[[R], bool]) -> R | None:
        """The stored record (of type ``kind``) if there is one and ``check(record)`` says its
        artifact is intact; a record that does not parse or fails the check is removed (the
        stage then runs again)."""
        path = self.path(stage, key)
        try:
            record = kind.from_json(unmark_home(json.loads(path.read_text())))
        except FileNotFoundError:
            return None
        except (json.JSONDecodeError, UnicodeDecodeError, RecordError):
            path.unlink(missing_ok=True)
            return None
        try:
            intact = check(record)
        except (OSError, KeyError, TypeError, ValueError):
            intact = False
        if not intact:
            path.unlink(missing_ok=True)
            return None
        return record

    def put(self, stage: str, key: str, record: Record) -> None:
        """Store ``record`` (written beside, then renamed: never half a file)."""
        path = self.path(stage, key)
        staging = path.with_name(f".{path.name}.{os.getpid()}.partial")
        staging.write_text(json.dumps(mark_home(record.to_json()), indent=1))
        staging.replace(path)
