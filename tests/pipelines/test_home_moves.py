"""A home is one folder: moved to another path, or copied, it runs where it is, through the CLI,
and never reads from, writes into or recreates its old place.

One tiny run (~40 s on two quiet cores) makes the home; the rest reuses its stages. It is the
issue's "done when" for the home (issue 49), so it runs the verbs a user would after moving it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("prefect_server")

REUSED = ("collect", "pretrain", "finetune", "export", "evaluate", "latency")
"""The stages a second run of the same config reuses, wherever the home now is."""


def robo_pipe(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """The CLI on ``home``, reporting to this module's Prefect test server (no temporary server
    per command: the home's own Prefect database is not what this test is about)."""
    from prefect.settings import PREFECT_API_URL

    api = str(PREFECT_API_URL.value())
    env = {"ROBO_PIPE_HOME": str(home), "COLUMNS": "200", "PREFECT_API_URL": api}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def tiny_run(home: Path) -> dict[str, object]:
    """``robo-pipe run --config tiny.yaml --json`` on ``home``: its result (the tiny policy is
    blocked by the success gate, exit 1, which is not what this test is about)."""
    run = robo_pipe("run", "--config", str(TINY_CONFIG), "--json", home=home)
    assert run.returncode in (0, 1), run.stderr[-3000:]
    result: dict[str, object] = json.loads(run.stdout.strip().splitlines()[-1])
    return result


def naming(home: Path, place: Path) -> list[str]:
    """The files under ``home`` whose bytes name the folder ``place`` (SQLite databases too)."""
    needle = str(place).encode()
    return sorted(
        str(path.relative_to(home))
        for path in home.rglob("*")
        if path.is_file() and needle in path.read_bytes()
    )


def tree_hash(home: Path) -> str:
    """sha256 over every file's relative path and bytes: any write under ``home`` changes it."""
    digest = hashlib.sha256()
    for path in sorted(home.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(home)).encode() + path.read_bytes())
    return digest.hexdigest()


def test_a_moved_or_copied_home_runs_where_it_is_and_never_touches_its_old_place(
    tmp_path: Path,
) -> None:
    old, moved, copy = tmp_path / "old-home", tmp_path / "moved-home", tmp_path / "copy-home"
    tiny_run(old)
    old.rename(moved)

    listed = robo_pipe("models", "list", home=moved)
    assert listed.returncode == 0 and "demo-policy" in listed.stdout, listed.stderr[-3000:]
    evaluated = robo_pipe(
        "evaluate", "models:/demo-policy/1", "--config", str(TINY_CONFIG), "--json", home=moved
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert f"report: {moved}/runs/" in " ".join(evaluated.stderr.split())
    again = tiny_run(moved)
    stages = again["stages"]
    assert isinstance(stages, dict)
    assert all(stages[stage]["reused"] for stage in REUSED), stages  # keys hold across a move
    assert str(again["run_dir"]).startswith(f"{moved}/runs/")
    assert str(again["export"]).startswith(f"{moved}/exports/")
    assert not old.exists()  # nothing wrote into (or recreated) the old place
    assert naming(moved, old) == []

    # A copy, the original kept: the copy's run reads and writes only the copy.
    shutil.copytree(moved, copy, symlinks=True)
    before = tree_hash(moved)
    copied = tiny_run(copy)
    assert str(copied["export"]).startswith(f"{copy}/exports/")
    assert tree_hash(moved) == before
    assert naming(copy, moved) == []
