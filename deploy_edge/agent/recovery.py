"""Recovery at the agent's start: a deployment the journal shows was cut off before its commit
(``kill -9``, power loss) is undone, so the device always runs a complete old or new version.

The journal (:mod:`deploy_edge.agent.journal`) holds, per deployment, its begin record, the
links as they were before it first changed them, each step's start and end, and its end record.
A deployment with a begin and no end was cut off: its links are put back, its slot is left to
the garbage collection, and it is recorded in the history as "interrupted", naming the step it
was in. An end record the history lacks (a crash between the two writes) is copied over.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from deploy_edge.agent.history import History
from deploy_edge.agent.journal import Journal
from deploy_edge.agent.slots import SlotStore
from deploy_edge.wire import Deployment
from robo_pipe.records import RecordError


def undo_cut_off(journal: Journal, slots: SlotStore, history: History) -> list[str]:
    """Undo every deployment the journal shows was cut off, repair the history; returns what
    was done, one note each."""
    cut_off: dict[str, dict[str, Any]] = {}
    finished: dict[str, dict[str, Any]] = {}
    for event in journal.read():
        kind, run_id = event.get("event"), str(event.get("id"))
        if kind == "begin":
            cut_off[run_id] = {"deployment": event["deployment"], "step": "", "links": None}
        elif kind == "end":
            cut_off.pop(run_id, None)
            finished[run_id] = event["deployment"]
        elif run_id not in cut_off:
            continue
        elif kind == "links" and cut_off[run_id]["links"] is None:
            cut_off[run_id]["links"] = event
        elif kind == "step" and event.get("phase") == "start":
            cut_off[run_id]["step"] = event["step"]
        elif kind == "step" and event.get("phase") == "end":
            cut_off[run_id]["deployment"]["steps"].append(event["result"])
    notes = history.repair(finished)
    for run_id, info in cut_off.items():
        notes.append(_undo_one(journal, slots, history, run_id, info))
    return notes


def _undo_one(
    journal: Journal, slots: SlotStore, history: History, run_id: str, info: dict[str, Any]
) -> str:
    try:
        deployment = Deployment.from_json(info["deployment"])
    except RecordError:
        deployment = Deployment(run_id, "", "", "", 0, "running")
    links = info["links"] or {}
    changed = slots.restore(links.get("before"), links.get("slot"))
    undone = f"links restored: {', '.join(changed)}" if changed else "no link had changed"
    deployment.state = "interrupted"
    deployment.finished_at = datetime.now(UTC).isoformat(timespec="seconds")
    where = f"step '{info['step']}'" if info["step"] else "its start"
    deployment.reason = f"{where}: the agent stopped before the commit; {undone}"
    journal.append({"event": "end", "id": run_id, "deployment": deployment.to_json()})
    history.append(deployment)
    label = f"{deployment.label} (release {deployment.release})"
    return f"deployment {run_id} ({label}) interrupted at {where}; {undone}"
