"""Flow runs whose process died: found, marked ``Crashed``, and linked to the run that continues.

A process killed with ``kill -9`` (or by the OOM killer, or a power cut) cannot report its end,
so Prefect shows its flow run ``Running`` forever and MLflow its run ``RUNNING``. To tell a dead
run from a live one, every flow run holds an exclusive ``flock`` on a small file,
``$ROBO_PIPE_HOME/runs/.active/<flow run id>.json``, for as long as it runs: the kernel drops the
lock when the process ends, however it ends, and pid reuse cannot fool it.

When a flow run starts (``robo-pipe run``, a served deployment, a direct call),
:func:`reconcile` looks at the other files: one whose lock it can take belongs to a run whose
process is gone. Its Prefect flow run becomes ``Crashed`` (unless it reached a final state) and
its MLflow run, with its stages' nested runs, ``KILLED``. When it ran the same flow on the same
config, the new run is its continuation (it reuses the stages the dead one completed): the new
flow run gets the tag ``continues:<old run name>`` and a link to it, and the crashed run's state
message names the run that continued it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Literal
from uuid import UUID

from pipelines.home import home_dir

ACTIVE_DIR = ".active"
"""Under ``$ROBO_PIPE_HOME/runs``: one locked file per flow run in progress."""
CONTINUES_TAG = "continues:"
"""Prefix of the tag a flow run gets for each crashed run of its flow and config it continues."""


@dataclass(frozen=True)
class ActiveRun:
    """What a running flow run leaves behind for whoever finds it dead."""

    flow_run_id: str
    flow_run_name: str
    flow: str
    """The flow's name (``train_simulate_deploy``, ``champion_regression``)."""
    config_hash: str
    prefect_api_url: str | None
    """None: the temporary local server on the home's Prefect database."""
    mlflow_run_id: str
    pid: int
    host: str
    started: str
    """UTC time the run started."""


class RunLock:
    """The lock a running flow run holds on its file (see the module docstring)."""

    def __init__(self, path: Path, handle: IO[str]) -> None:
        self.path = path
        self._handle = handle

    def release(self) -> None:
        """The run ended and said so: remove the file, then drop the lock."""
        if self._handle.closed:
            return
        self.path.unlink(missing_ok=True)
        self._handle.close()


def _active_dir() -> Path:
    path = home_dir("runs") / ACTIVE_DIR
    path.mkdir(exist_ok=True)
    return path


def hold(run: ActiveRun) -> RunLock:
    """Take the lock of ``run`` for as long as this process runs it (until
    :meth:`RunLock.release` or the process ends)."""
    final = _active_dir() / f"{run.flow_run_id}.json"
    # Locked before it gets its name, so no reconciler ever sees it unlocked while we live.
    staging = final.with_name(f".{final.name}.{os.getpid()}.partial")
    handle = staging.open("w")
    fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    handle.write(json.dumps(asdict(run), indent=1))
    handle.flush()
    staging.replace(final)
    return RunLock(final, handle)


def new_active_run(
    flow_run_id: str, flow_run_name: str, flow: str, config_hash: str, mlflow_run_id: str
) -> ActiveRun:
    """The record of a run starting now in this process."""
    return ActiveRun(
        flow_run_id=flow_run_id,
        flow_run_name=flow_run_name,
        flow=flow,
        config_hash=config_hash,
        prefect_api_url=os.environ.get("PREFECT_API_URL") or None,
        mlflow_run_id=mlflow_run_id,
        pid=os.getpid(),
        host=socket.gethostname(),
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )


@dataclass(frozen=True)
class Reconciled:
    """A dead run :func:`reconcile` found and marked."""

    run: ActiveRun
    continued: bool
    """The new run continues it (same flow, same config)."""
    state_before: str
    """Its Prefect state when found (``RUNNING`` for a killed run)."""


def reconcile(current: ActiveRun, prefect_ui: str) -> list[Reconciled]:
    """Mark every run of this home whose process is gone as crashed (Prefect ``Crashed``,
    MLflow ``KILLED``) and record which of them ``current`` continues; ``prefect_ui`` is where
    links point."""
    found: list[Reconciled] = []
    for path in sorted(_active_dir().glob("*.json")):
        if path.stem == current.flow_run_id:
            continue
        try:
            handle = path.open("r+")
        except FileNotFoundError:  # it ended, or another reconciler took it
            continue
        with handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # its process is alive
                continue
            if not _still_named(path, handle):  # its run ended normally just now
                continue
            try:
                dead = ActiveRun(**json.loads(handle.read()))
            except (json.JSONDecodeError, TypeError):
                path.unlink(missing_ok=True)  # not a record this version wrote
                continue
            outcome = _mark_crashed(dead, current, prefect_ui)
            if outcome == "elsewhere":  # leave it for a run on that Prefect server
                continue
            path.unlink(missing_ok=True)
            if isinstance(outcome, Reconciled):
                found.append(outcome)
    for partial in _active_dir().glob(".*.partial"):  # a run killed while taking its lock
        with contextlib.suppress(FileNotFoundError, BlockingIOError), partial.open() as handle:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            partial.unlink()
    continued = [r.run for r in found if r.continued]
    if continued:
        _link_continuation(current, continued, prefect_ui)
    return found


def _still_named(path: Path, handle: IO[str]) -> bool:
    """``handle`` is still the file at ``path``: a run that ends removes its file before it
    drops the lock, so a lock taken on a file that lost its name was released normally."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def _mark_crashed(
    dead: ActiveRun, current: ActiveRun, prefect_ui: str
) -> Reconciled | Literal["elsewhere", "ended"]:
    """Mark ``dead`` crashed. ``elsewhere``: its flow run is on another Prefect server (its
    MLflow runs are marked all the same); ``ended``: its flow run reached a final state before
    its process died (cancelled by ``robo-pipe serve`` on its way out, say)."""
    from prefect.client.orchestration import get_client
    from prefect.exceptions import ObjectNotFound
    from prefect.states import Crashed

    continued = dead.flow == current.flow and dead.config_hash == current.config_hash
    message = (
        f"process {dead.pid} on {dead.host} ended without reporting (killed?); found by "
        f"flow run '{current.flow_run_name}' ({prefect_ui}/runs/flow-run/{current.flow_run_id})"
        + (", which continues it" if continued else "")
    )
    _kill_mlflow_runs(dead, message, current.mlflow_run_id if continued else None)
    with get_client(sync_client=True) as client:
        try:
            state = client.read_flow_run(UUID(dead.flow_run_id)).state
        except ObjectNotFound:
            same_server = dead.prefect_api_url == current.prefect_api_url
            return "ended" if same_server else "elsewhere"
        if state is not None and state.is_final():
            return "ended"
        client.set_flow_run_state(dead.flow_run_id, Crashed(message=message), force=True)
    return Reconciled(dead, continued, state.type.value if state else "UNKNOWN")


def _kill_mlflow_runs(dead: ActiveRun, message: str, continued_by: str | None) -> None:
    """The dead run's MLflow run and its stages' nested runs that still say ``RUNNING``
    become ``KILLED``, tagged with why (and the MLflow run that continues it)."""
    from mlflow.exceptions import MlflowException

    from pipelines import tracking

    mlflow = tracking.client()
    try:
        parent = mlflow.get_run(dead.mlflow_run_id)
    except MlflowException:  # in another tracking store
        return
    nested = mlflow.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{dead.mlflow_run_id}' "
        "and attributes.status = 'RUNNING'",
    )
    for run in [parent, *nested]:
        if run.info.status != "RUNNING":
            continue
        mlflow.set_tag(run.info.run_id, tracking.TAG + "crashed", message)
        if continued_by and run is parent:
            mlflow.set_tag(run.info.run_id, tracking.TAG + "continued_by", continued_by)
        mlflow.set_terminated(run.info.run_id, "KILLED")


def _link_continuation(current: ActiveRun, dead: list[ActiveRun], prefect_ui: str) -> None:
    """Tag the new flow run (``continues:<name>``) and its MLflow run with the runs it
    continues; a link artifact on it leads to each in the Prefect UI."""
    from prefect.artifacts import create_link_artifact
    from prefect.client.orchestration import get_client

    from pipelines import tracking

    with get_client(sync_client=True) as client:
        flow_run = client.read_flow_run(UUID(current.flow_run_id))
        tags = {*flow_run.tags, *(CONTINUES_TAG + d.flow_run_name for d in dead)}
        client.update_flow_run(UUID(current.flow_run_id), tags=sorted(tags))
    tracking.client().set_tag(
        current.mlflow_run_id,
        tracking.TAG + "continues_flow_runs",
        ",".join(d.flow_run_id for d in dead),
    )
    for d in dead:
        create_link_artifact(
            f"{prefect_ui}/runs/flow-run/{d.flow_run_id}",
            link_text=f"continues crashed run '{d.flow_run_name}' (started {d.started})",
            description="the same flow on the same config, run again after its process died",
        )
