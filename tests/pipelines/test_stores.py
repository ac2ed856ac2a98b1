"""The embedded MLflow store: created once when several processes open a fresh home at the same
moment, repaired when an interrupted migration left it half-migrated, and refused with what to
do when it cannot be repaired."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
from contextlib import closing
from pathlib import Path

import pytest

from tests.pipelines.test_flow import robo_pipe


def _open_and_log(home: str, barrier: object) -> None:
    os.environ["ROBO_PIPE_HOME"] = home
    from pipelines import tracking
    from pipelines.services.settings import configure

    configure()
    barrier.wait()  # type: ignore[attr-defined]
    run = tracking.TrackedRun.start("stores-test", f"process-{os.getpid()}")
    run.log_metrics({"x": 1.0})
    run.finish()


def tables(db: Path) -> list[str]:
    with closing(sqlite3.connect(db)) as conn:
        return [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]


def test_processes_opening_a_fresh_home_together_create_the_store_once(
    robo_pipe_home: Path,
) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(4)
    procs = [
        ctx.Process(target=_open_and_log, args=(str(robo_pipe_home), barrier)) for _ in range(4)
    ]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(180)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    db = robo_pipe_home / "mlflow" / "mlflow.db"
    assert not [t for t in tables(db) if t.startswith("_alembic_tmp_")]
    with closing(sqlite3.connect(db)) as conn:
        runs = conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
        experiments = conn.execute(
            "SELECT COUNT(*) FROM experiments WHERE name = 'stores-test'"
        ).fetchone()[0]
    assert (runs, experiments) == (4, 1)


def half_migrated_store(db: Path) -> None:
    """What two processes migrating one fresh store at once left behind: the schema stopped
    one migration short of adding the workspace columns, and that migration's copy of
    ``experiments`` (SQLite batch migrations copy a table, alter it, rename it back) is still
    there. MLflow's own migration machinery builds it, as a crashed first start would."""
    import sqlalchemy
    from alembic import command
    from alembic.script import ScriptDirectory
    from mlflow.store.db.utils import _get_alembic_config
    from mlflow.store.tracking.dbmodels.initial_models import Base as InitialBase

    uri = f"sqlite:///{db}"
    db.parent.mkdir(parents=True, exist_ok=True)
    InitialBase.metadata.create_all(sqlalchemy.create_engine(uri))
    config = _get_alembic_config(uri)
    script = ScriptDirectory.from_config(config)
    interrupted = next(r for r in script.walk_revisions() if r.revision == "1b5f0d9ad7c1")
    command.upgrade(config, str(interrupted.down_revision))
    with closing(sqlite3.connect(db)) as conn, conn:
        sql = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'experiments'").fetchone()[0]
        conn.execute(sql.replace("experiments", "_alembic_tmp_experiments", 1))


def test_a_half_migrated_store_is_repaired(robo_pipe_home: Path) -> None:
    db = robo_pipe_home / "mlflow" / "mlflow.db"
    half_migrated_store(db)

    listed = robo_pipe("models", "list", home=robo_pipe_home)

    assert listed.returncode == 0, listed.stderr
    assert "half-migrated" in listed.stderr and "_alembic_tmp_experiments" in listed.stderr
    assert "_alembic_tmp_experiments" not in tables(db)
    again = robo_pipe("models", "list", home=robo_pipe_home)
    assert again.returncode == 0 and "half-migrated" not in again.stderr


def test_a_store_beyond_repair_is_a_named_error(robo_pipe_home: Path) -> None:
    db = robo_pipe_home / "mlflow" / "mlflow.db"
    db.parent.mkdir(parents=True)
    db.write_bytes(b"not a database" * 100)

    listed = robo_pipe("models", "list", home=robo_pipe_home)

    assert listed.returncode == 2, listed.stderr
    assert str(db) in listed.stderr and f"mv {db}" in listed.stderr
    assert "Traceback" not in listed.stderr
    assert db.read_bytes() == b"not a database" * 100, "the file is left for the user to keep"


def test_a_store_written_by_an_older_robo_pipe_moves_with_its_home(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store from before the home tag (experiments at ``<home>/mlflow/artifacts/<name>``,
    ``Default`` in ``./mlruns``), moved: the first open in the new place points every location
    into it, ``Default`` included, and no byte of it names the old place."""
    from mlflow import MlflowClient

    from pipelines.home import default_tracking_uri
    from pipelines.stores import HOME_TAG, ensure_mlflow_store

    old, new = tmp_path / "old-home", tmp_path / "new-home"
    (old / "mlflow").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # MLflow's ./mlruns lands here
    uri = f"sqlite:///{old / 'mlflow' / 'mlflow.db'}"
    older = MlflowClient(uri, uri)  # as an older robo-pipe left it: no tag
    demo = older.create_experiment("demo", (old / "mlflow" / "artifacts" / "demo").as_uri())
    older.create_run(demo)
    old.rename(new)
    monkeypatch.setenv("ROBO_PIPE_HOME", str(new))
    ensure_mlflow_store(default_tracking_uri())

    db = new / "mlflow" / "mlflow.db"
    artifacts = (new / "mlflow" / "artifacts").as_uri()
    with closing(sqlite3.connect(db)) as conn:
        where = dict(conn.execute("SELECT name, artifact_location FROM experiments").fetchall())
        (run_uri,) = conn.execute("SELECT artifact_uri FROM runs").fetchone()
        (tag,) = conn.execute("SELECT value FROM experiment_tags WHERE key = ?", (HOME_TAG,))
    assert where == {"Default": f"{artifacts}/0", "demo": f"{artifacts}/demo"}
    assert run_uri.startswith(f"{artifacts}/demo/") and tag == (str(new),)
    assert str(old).encode() not in db.read_bytes()


def test_a_fresh_homes_prefect_database_is_a_copy_of_the_machines_migrated_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first home on a machine migrates Prefect's database once, into the cache; every
    fresh home after it gets a copy at the migrations' head without migrating; a database
    already in a home (an older Prefect's) is migrated in place, never replaced."""
    from pipelines import stores

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    migrations: list[Path] = []
    migrate = stores._migrate_prefect

    def counted(prefect_home: Path) -> None:
        migrations.append(prefect_home)
        migrate(prefect_home)

    monkeypatch.setattr(stores, "_migrate_prefect", counted)

    def fresh_home(name: str) -> Path:
        prefect_home = tmp_path / name / "prefect"
        monkeypatch.setenv("PREFECT_HOME", str(prefect_home))
        stores._ready.clear()
        stores.ensure_prefect_store()
        return prefect_home / "prefect.db"

    def head(database: Path) -> str:
        with closing(sqlite3.connect(database)) as db:
            [(revision,)] = db.execute("SELECT version_num FROM alembic_version").fetchall()
        return str(revision)

    first = fresh_home("a")
    assert len(migrations) == 1 and migrations[0].parent == tmp_path / "cache" / "robo-pipe"
    second = fresh_home("b")
    assert len(migrations) == 1, "a fresh home copies the migrated database"
    assert head(first) == head(second) == head(stores.prefect_template())
    assert not any(p.name.startswith(".prefect-") for p in (tmp_path / "cache/robo-pipe").iterdir())

    # A home whose database exists but is not marked migrated by this Prefect: migrated.
    older = tmp_path / "c" / "prefect"
    older.mkdir(parents=True)
    (older / "prefect.db").write_bytes(second.read_bytes())
    with closing(sqlite3.connect(older / "prefect.db")) as db, db:
        db.execute("CREATE TABLE kept (x)")
    fresh_home("c")
    assert migrations[-1] == older, "migrated in place"
    with closing(sqlite3.connect(older / "prefect.db")) as db:
        assert db.execute("SELECT name FROM sqlite_master WHERE name = 'kept'").fetchall()


def test_a_fresh_homes_mlflow_store_is_a_copy_of_the_machines_migrated_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first home on a machine creates MLflow's store once, into the cache; every fresh
    home after it gets a copy, settled in its own place (``Default`` and the home tag point
    into it, nothing names the template's folder or another home) and ready for runs."""
    from pipelines import stores
    from pipelines.home import default_tracking_uri

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    builds: list[Path] = []
    build = stores._build_mlflow_template

    def counted(folder: Path) -> Path:
        builds.append(folder)
        return build(folder)

    monkeypatch.setattr(stores, "_build_mlflow_template", counted)

    def fresh_home(name: str) -> Path:
        home = tmp_path / name
        monkeypatch.setenv("ROBO_PIPE_HOME", str(home))
        stores.ensure_mlflow_store(default_tracking_uri())
        return home

    homes = [fresh_home("a"), fresh_home("b")]
    assert len(builds) == 1, "a fresh home copies the created store"
    cache = tmp_path / "cache" / "robo-pipe"
    assert not any(p.name.startswith(".mlflow-") for p in cache.iterdir())
    for home in homes:
        db = home / "mlflow" / "mlflow.db"
        with closing(sqlite3.connect(db)) as conn:
            (location,) = conn.execute(
                "SELECT artifact_location FROM experiments WHERE experiment_id = 0"
            ).fetchone()
            tags = conn.execute(
                "SELECT value FROM experiment_tags WHERE key = ?", (stores.HOME_TAG,)
            ).fetchall()
        assert location == f"{(home / 'mlflow' / 'artifacts').as_uri()}/0"
        assert tags == [(str(home),)]
        assert str(cache).encode() not in db.read_bytes()
    assert str(homes[0]).encode() not in (homes[1] / "mlflow" / "mlflow.db").read_bytes()
