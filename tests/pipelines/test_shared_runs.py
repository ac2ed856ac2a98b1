"""Many runs, one home, through the CLI: on a fresh home, three ``robo-pipe run`` processes start
together (two configs that register into one model, one of them twice) and a champion check
joins once there is a champion. Every one finishes; the stores are created once; the shared
stages are produced once and waited for; the registry holds one version per export; and
``champion`` only ever moved to a version that passed every gate against the champion it
replaced."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from stages.register.gates import NO_REGRESSION
from tests.pipelines.test_cli import ROOT
from tests.pipelines.test_flow import CONFIG, TINY

MODEL = "shared-policy"
BASE = [*TINY, f"registry.model_name={MODEL}", "deploy.local_agent=false"]
VARIANTS = {
    "a": [],
    "a-again": [],
    "c": ["finetune.bc.steps=14", "name=Demo.v2 arm"],  # a name as users type it
}


def start(home: Path, *args: str) -> subprocess.Popen[str]:
    import os

    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def cli_sets(extra: list[str]) -> list[str]:
    return [arg for s in [*BASE, *extra] for arg in ("--set", s)]


def has_champion(home: Path) -> bool:
    """Whether the registry has a champion yet (read straight from the SQLite file, so the
    test does not open the store itself)."""
    path = home / "mlflow" / "mlflow.db"
    if not path.is_file():
        return False
    try:
        with closing(sqlite3.connect(path, timeout=1)) as db:
            rows = db.execute(
                "SELECT 1 FROM registered_model_aliases WHERE name = ? AND alias = 'champion'",
                (MODEL,),
            ).fetchall()
    except sqlite3.Error:
        return False
    return bool(rows)


def test_concurrent_runs_share_one_home(robo_pipe_home: Path) -> None:
    runs = {
        name: start(robo_pipe_home, "run", "-c", CONFIG, *cli_sets(extra))
        for name, extra in VARIANTS.items()
    }
    check = None
    deadline = time.monotonic() + 1200
    while any(p.poll() is None for p in runs.values()) and time.monotonic() < deadline:
        if check is None and has_champion(robo_pipe_home):
            check = start(robo_pipe_home, "models", "check", "-c", CONFIG, *cli_sets([]))
        time.sleep(1)
    outputs = {name: p.communicate(timeout=60) for name, p in runs.items()}
    for name, (_out, err) in outputs.items():
        # Each finished: promoted (0), or a candidate a gate blocked against a newer champion
        # (1, the verdict's exit code).
        code = runs[name].returncode
        assert code == 0 or (code == 1 and "verdict: blocked" in err), f"run {name}:\n{err[-3000:]}"
    assert check is not None, "no champion appeared while the runs ran"
    _check_out, check_err = check.communicate(timeout=600)
    assert check.returncode == 0, check_err[-3000:]

    # The shared stages (dataset, base, the same config's checkpoint and export) were
    # produced once: the other runs waited for them and said so.
    everything = "\n".join(err for _, err in outputs.values())
    assert "waiting for run" in everything

    from pipelines.registry.promotion import champion_history
    from pipelines.registry.tags import ONNX_HASH_TAG, PROMOTED_ON_TAG, PROMOTED_OVER_TAG
    from pipelines.registry.versions import champion, versions
    from pipelines.services.settings import configure

    configure()
    registered = versions(MODEL)
    hashes = [v.tags[ONNX_HASH_TAG] for v in registered]
    assert len(hashes) == len(set(hashes)) == 2, "one version per export (a and a-again share one)"
    current = champion(MODEL)
    assert current is not None
    history = champion_history(MODEL)
    assert history[-1] == current.version
    by_version = {v.version: v for v in registered}
    # Every promotion (a version may have been promoted more than once: its last one is
    # recorded) passed every gate against the champion it replaced.
    promoted = [v for v in registered if PROMOTED_OVER_TAG in v.tags]
    assert current.version in {v.version for v in promoted}
    for version in promoted:
        over = version.tags[PROMOTED_OVER_TAG]
        gates = json.loads(version.tags[PROMOTED_ON_TAG])
        assert all(verdict.startswith("passed") for verdict in gates.values()), gates
        expected = f"vs v{over}" if over else "no champion yet"
        assert expected in gates[NO_REGRESSION], (version.version, over, gates)
    if len(history) > 1:
        assert by_version[current.version].tags[PROMOTED_OVER_TAG] == (history[-2]), (
            "the champion replaced the one before it in the history"
        )

    with closing(sqlite3.connect(robo_pipe_home / "mlflow" / "mlflow.db")) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert not [t for t in tables if t.startswith("_alembic_tmp_")]

    again = start(robo_pipe_home, "run", "-c", CONFIG, *cli_sets([]), "--json")
    out, err = again.communicate(timeout=600)
    assert out.strip(), err[-3000:]
    result = json.loads(out.strip().splitlines()[-1])
    assert again.returncode == (0 if result["promoted"] else 1), err[-3000:]
    assert result["version"] in by_version, "the same config's export is the same version"
    trained = ("collect", "pretrain", "finetune", "export")
    assert all(result["stages"][stage]["reused"] for stage in trained), result["stages"]
    assert len(versions(MODEL)) == 2
