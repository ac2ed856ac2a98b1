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
  what to do. The home's own store is also kept inside the home
  (:func:`settle_in_home`): MLflow records absolute artifact locations, so when the home was
  moved or copied, every path of the old home in the database is rewritten to the new one
  before anything reads it, and MLflow's ``Default`` experiment is kept under the home
  (:func:`settle_home_store` does it alone, for ``robo-pipe ui``'s MLflow server).
- :func:`ensure_prefect_store`: the home's Prefect database, migrated before a temporary
  Prefect server (or ``robo-pipe ui``'s) starts on it, so that servers never migrate it
  concurrently and a first start on a cold disk does not spend Prefect's start-up timeout on
  migrations.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from contextlib import closing
from importlib.metadata import version
from pathlib import Path
from urllib.parse import quote, unquote, urlparse

from filelock import FileLock

from pipelines.home import default_artifact_root, default_tracking_uri, robo_pipe_home
from robo_pipe.atomic import temporary_path
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
        if not existed:  # a migrated empty store, copied: MLflow's migrations take ~3 s
            _copy_atomically(_template("mlflow", _build_mlflow_template), path)
        stale = _stale_migration_tables(path)
        try:
            if stale:
                raise StoreError(f"an interrupted migration left {', '.join(stale)}")
            _open_mlflow_store(uri)
        except Exception as err:
            if not existed:  # a store this process just created: not damage, a bug
                raise
            _repair_mlflow_store(uri, path, err)
        if uri == default_tracking_uri():
            settle_in_home(path, robo_pipe_home())
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


HOME_TAG = "robo_pipe.home"
"""Tag of MLflow's ``Default`` experiment (id 0) in the home's own store: the home's path when
the store was last opened, so that a store opened in another place knows it moved."""

_OLDER_HOME = re.compile(r"^file://(/.*)/mlflow/artifacts/[^/]+$")
"""An experiment location an older robo-pipe gave (``<home>/mlflow/artifacts/<name>``), where
the database does not carry :data:`HOME_TAG`."""


def settle_in_home(database: Path, home: Path) -> None:
    """Make the home's MLflow store at ``database`` point inside ``home``: if it was last opened
    in another place (the home was moved or copied), rewrite every path of that place in it
    (experiment and run artifact locations, model version sources, tags) to ``home``, so that
    nothing is read from or written into the old place; and keep the ``Default`` experiment's
    artifacts under the home (MLflow puts them in ``<current folder>/mlruns``). The caller holds
    the store's lock. Writes nothing when the store is already settled."""
    with closing(sqlite3.connect(database)) as db, db:
        row = db.execute(
            "SELECT value FROM experiment_tags WHERE experiment_id = 0 AND key = ?", (HOME_TAG,)
        ).fetchone()
        old = row[0] if row else _home_of_older_store(db)
        if old == str(home) and row:
            return
        if old and old != str(home):
            _rewrite_prefix(db, old, str(home))
        default_location = f"{default_artifact_root()}/0"
        runs = db.execute("SELECT count(*) FROM runs WHERE experiment_id = 0").fetchone()[0]
        if runs == 0:  # an empty Default experiment moves in; one with runs keeps them
            db.execute(
                "UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0",
                (default_location,),
            )
        db.execute(
            "INSERT OR REPLACE INTO experiment_tags (key, value, experiment_id) VALUES (?, ?, 0)",
            (HOME_TAG, str(home)),
        )


def settle_home_store() -> None:
    """:func:`settle_in_home` for the home's store, if it exists, under its lock, without loading
    MLflow: for ``robo-pipe ui``, whose MLflow server opens the store itself."""
    path = sqlite_path(default_tracking_uri())
    if path is None or not path.is_file():
        return
    with FileLock(f"{path}.init.lock"):
        settle_in_home(path, robo_pipe_home())


def _home_of_older_store(db: sqlite3.Connection) -> str | None:
    """Where a store written by an older robo-pipe (no :data:`HOME_TAG`) was: the home its
    experiments' artifact locations name (the most common one); None if none does."""
    counts: dict[str, int] = {}
    for (location,) in db.execute("SELECT artifact_location FROM experiments"):
        found = _OLDER_HOME.match(location or "")
        if found:
            place = unquote(found.group(1))
            counts[place] = counts.get(place, 0) + 1
    return max(counts, key=lambda place: counts[place]) if counts else None


def _rewrite_prefix(db: sqlite3.Connection, old: str, new: str) -> None:
    """Replace the folder ``old`` by ``new`` in every text column of every table: as a path
    (``old`` itself or ``old/...``) and as it appears in a ``file://`` URI (percent-encoded)."""
    pairs = {(old + "/", new + "/"), (quote(old) + "/", quote(new) + "/")}
    tables = db.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
    ).fetchall()
    for (table,) in tables:
        for column in db.execute(f'PRAGMA table_info("{table}")').fetchall():
            name, kind = column[1], str(column[2]).upper()
            if not any(text in kind for text in ("CHAR", "TEXT", "CLOB")):
                continue
            db.execute(f'UPDATE "{table}" SET "{name}" = ? WHERE "{name}" = ?', (new, old))
            for before, after in pairs:
                db.execute(
                    f'UPDATE "{table}" SET "{name}" = replace("{name}", ?, ?) '
                    f'WHERE instr("{name}", ?) > 0',
                    (before, after, before),
                )


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
            if database.is_file():  # an older Prefect's, or one whose migration stopped
                _migrate_prefect(home)
            else:
                _copy_atomically(prefect_template(), database)
            marker.touch()
    _ready.add(str(database))


def prefect_template() -> Path:
    """An empty Prefect database migrated to this Prefect version's head (:func:`_template`).

    Why: Prefect's migrations take ~14 s of a fresh home's first run on 2 cores (over a hundred
    of them, one after another); a copy of the migrated file takes milliseconds."""
    return _template("prefect", _build_prefect_template)


def _build_prefect_template(folder: Path) -> Path:
    """An empty Prefect database, created and migrated in ``folder``."""
    _migrate_prefect(folder)
    return folder / "prefect.db"


def _build_mlflow_template(folder: Path) -> Path:
    """An empty MLflow tracking store and registry, created and migrated in ``folder``."""
    database = folder / "mlflow.db"
    _open_mlflow_store(f"sqlite:///{database}")
    return database


def _template(package: str, build: Callable[[Path], Path]) -> Path:
    """The empty database ``build`` makes (in the folder it is given; it returns the file) for
    this version of ``package``, made once per machine under ``$XDG_CACHE_HOME/robo-pipe``
    (default ``~/.cache/robo-pipe``) as ``<package>-<version>.db``; a fresh home copies it. It
    is built under a lock and renamed into place whole, so a copy never sees half of one."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "robo-pipe"
    template = cache / f"{package}-{version(package)}.db"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{template}.lock"):
        if not template.is_file():
            building = cache / f".{package}-{version(package)}-{os.getpid()}"
            building.mkdir(exist_ok=True)
            try:
                os.replace(build(building), template)
            finally:
                shutil.rmtree(building, ignore_errors=True)
    return template


def _copy_atomically(source: Path, target: Path) -> None:
    """``target`` becomes a copy of ``source``, whole or not at all."""
    partial = temporary_path(target)  # the project's owned temporary name, cleanable
    shutil.copyfile(source, partial)
    os.replace(partial, target)


def _migrate_prefect(prefect_home: Path) -> None:
    """Prefect's own ``prefect server database upgrade`` on ``prefect_home``'s database, in a
    child process: its server code and settings stay out of this process (which may already
    run flows)."""
    done = subprocess.run(
        [str(Path(sys.executable).parent / "prefect"), "server", "database", "upgrade", "-y"],
        capture_output=True,
        text=True,
        check=False,
        env={
            **os.environ,
            "PREFECT_HOME": str(prefect_home),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        },
    )
    if done.returncode != 0:
        raise StoreError(
            f"could not create the Prefect database under {prefect_home}: "
            f"{(done.stderr or done.stdout).strip()[-500:]}"
        )
