"""The agent's history: every finished deployment, one JSON line each, appended durably
(``state_dir/history.jsonl``); a deployment updated later (staged, then activated) has several
lines, and the last one is its state."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from deploy_edge.agent.journal import json_line, read_json_lines
from deploy_edge.wire import Deployment
from robo_pipe.records import RecordError


class History:
    """The deployments finished on this device, read from and appended to ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def deployments(self) -> list[Deployment]:
        """Every finished deployment, newest first (the latest record of each)."""
        latest: dict[str, Deployment] = {}
        for record in read_json_lines(self.path):
            with contextlib.suppress(RecordError):
                deployment = Deployment.from_json(record)
                latest.pop(deployment.id, None)  # re-inserted last: ordered by last update
                latest[deployment.id] = deployment
        return list(reversed(latest.values()))

    def append(self, deployment: Deployment) -> None:
        """Record ``deployment`` as it is now; returns once it is on disk."""
        self._append_line(json_line(deployment.to_json()))

    def last(self, sha256: str, state: str) -> Deployment | None:
        """The newest deployment of the release ``sha256`` now in ``state``."""
        for deployment in self.deployments():
            if deployment.release_sha256 == sha256 and deployment.state == state:
                return deployment
        return None

    def repair(self, finished: dict[str, dict[str, Any]]) -> list[str]:
        """Append the end records (``finished``: the journal's, by deployment id) that the
        history lacks: a crash between the two writes."""
        last = {r.get("id"): r for r in read_json_lines(self.path)}
        notes = []
        for run_id, record in finished.items():
            if last.get(run_id) != record:
                self._append_line(json_line(record))
                notes.append(f"deployment {run_id}: history record restored from the journal")
        return notes

    def _append_line(self, line: str) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            os.fsync(f.fileno())
