"""The embedded stores several processes of one home share, created and migrated exactly once.

Two runs started together on a fresh home used to create the MLflow SQLite store at the same
time: both ran its migrations, one failed ("Online migration expected to match one row"), and
the store was left half-migrated (a stale ``_alembic_tmp_<table>`` table, the schema version
short of the head), so every later run failed too. Here each store is created under an
inter-process lock beside its database file, by the first process that needs it; the others
wait, then find it ready.

- :func:`ensure_mlflow_store`: the SQLite tracking store and registry (other tracking URIs are
  servers that own their store: nothing to do). A store that an earlier crash left
  half-migrated is repaired under the same lock: stale ``_alembic_tmp_*`` tables are dropped
  and ``mlflow db upgrade`` finishes the migration; if that fails, :class:`StoreError` says
  what to do.
- :func:`ensure_prefect_store`: the home's Prefect database, migrated before a temporary
  Prefect server (or ``robo-pipe ui``'s) starts on it, so that servers never migrate it
  concurrently and a first start on a cold disk does not spend Prefect's start-up timeout on
  migrations.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlparse

from filelock import FileLock

from robo_pipe.errors import RoboPipeError

_ready: set[str] = set()
"""Stores this process has already made sure of (the check runs once per process)."""


class StoreError(RoboPipeError, RuntimeError):
    """An embedded store is damaged beyond what robo-pipe repairs on its own."""


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI; None for any other kind of store."""
    if urlparse(uri).scheme != "sqlite":
        return None
    return Path(uri.removeprefix("sqlite:///").split("?", 1)[0])


def ensure_mlflow_store(uri: str | None = None) -> None:
    """Create (or finish migrating) the SQLite MLflow store at ``uri`` (default
    ``MLFLOW_TRACKING_URI``) under a lock, once per process. A no-op for server URIs."""
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI", "")
    path = sqlite_path(uri)
    if path is None or uri in _ready:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{path}.init.lock"):
        existed = path.is_file()
        stale = _stale_migration_tables(path)
        try:
            if stale:
                raise StoreError(f"an interrupted migration left {', '.join(stale)}")
            _open_mlflow_store(uri)
        except Exception as err:
            if not existed:  # a store this process just created: not damage, a bug
                raise
            _repair_mlflow_store(uri, path, err)
    _ready.add(uri)


def _open_mlflow_store(uri: str) -> None:
    """Open the tracking store and the registry: on a fresh file, MLflow creates and migrates
    both; on an existing one it checks the schema version."""
    from mlflow import MlflowClient

    # MLflow's notes on creating its tables are not the user's business; failures still raise.
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.WARNING)
    mlflow_client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    mlflow_client.search_experiments(max_results=1)
    mlflow_client.search_registered_models(max_results=1)


def _stale_migration_tables(path: Path) -> list[str]:
    """Tables a migration leaves behind when it is interrupted (SQLite batch migrations copy a
    table to ``_alembic_tmp_<name>`` and rename it back)."""
    if not path.is_file():
        return []
    try:
        with closing(sqlite3.connect(path)) as db:
            names = db.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall()
    except sqlite3.DatabaseError:  # not a database at all: opening it says so
        return []
    return [str(name) for (name,) in names if str(name).startswith("_alembic_tmp_")]


def _repair_mlflow_store(uri: str, path: Path, cause: Exception) -> None:
    """Drop the tables an interrupted migration left, finish the migration with MLflow's own
    ``mlflow db upgrade``, and open the store again; :class:`StoreError` if it still fails."""
    stale = _stale_migration_tables(path)
    print(
        f"MLflow store {path} was left half-migrated ({type(cause).__name__}: "
        f"{str(cause).splitlines()[0][:200]}); repairing it"
        + (f": dropping {', '.join(stale)}" if stale else ""),
        file=sys.stderr,
    )
    with closing(sqlite3.connect(path)) as db, db:
        for table in stale:
            db.execute(f'DROP TABLE "{table}"')
    upgrade = subprocess.run(
        [sys.executable, "-m", "mlflow", "db", "upgrade", uri],
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        if upgrade.returncode != 0:
            raise RuntimeError(upgrade.stderr.strip().splitlines()[-1])
        _open_mlflow_store(uri)
    except Exception as err:
        raise StoreError(
            f"the MLflow store {path} is damaged and could not be repaired ({err}). Move it "
            f"aside (mv {path} {path}.broken) to start a new registry, or restore a backup; "
            "exports and checkpoints under the home are not affected"
        ) from err


def prefect_database(prefect_home: Path) -> Path | None:
    """The home's Prefect SQLite database, or None when the user configured another one."""
    configured = os.environ.get("PREFECT_API_DATABASE_CONNECTION_URL") or os.environ.get(
        "PREFECT_SERVER_DATABASE_CONNECTION_URL"
    )
    return None if configured else prefect_home / "prefect.db"


def ensure_prefect_store() -> None:
    """Create and migrate the home's Prefect database under a lock, once: before a temporary
    Prefect server or ``robo-pipe ui``'s server starts on it. Skipped when ``PREFECT_API_URL``
    points at a running server (it owns its database)."""
    home = Path(os.environ["PREFECT_HOME"])
    database = prefect_database(home)
    if database is None or str(database) in _ready:
        return
    home.mkdir(parents=True, exist_ok=True)
    marker = home / f".migrated-{version('prefect')}"
    with FileLock(f"{database}.init.lock"):
        if not (marker.is_file() and database.is_file()):
            _migrate_prefect()
            marker.touch()
    _ready.add(str(database))


def _migrate_prefect() -> None:
    """Prefect's own ``prefect server database upgrade``, in a child process: its server code
    and settings stay out of this process (which may already run flows)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PREFECT_SERVER_ANALYTICS_ENABLED": "false"},
    )
    if done.returncode != 0:
        raise StoreError(
            f"could not create the Prefect database under {os.environ['PREFECT_HOME']}: "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        )
