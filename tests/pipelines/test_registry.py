"""The registry as `robo-pipe models list/show` read it, on the embedded SQLite store: every
version carries its aliases (MLflow's version search returns none there, mlflow#9783)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from pipelines import registry, tracking
from pipelines.services import configure

ROOT = Path(__file__).resolve().parents[2]


def test_models_list_and_show_name_the_champion_and_the_candidate(robo_pipe_home: Path) -> None:
    configure()
    run = tracking.TrackedRun.start("registry-test", "aliases")
    run.finish()
    mlflow = tracking.client()
    mlflow.create_registered_model("policy")
    for _ in range(3):
        mlflow.create_model_version("policy", f"runs:/{run.run_id}/export", run_id=run.run_id)
    # Set as MLflow's own alias editing would: no gate record, so the listing flags it "(!)".
    registry.set_alias("policy", "champion", "2")
    registry.set_alias("policy", "candidate", "3")

    by_version = {v.version: v.aliases for v in registry.versions("policy")}
    assert by_version == {"3": ["candidate"], "2": ["champion"], "1": []}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipelines.cli", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    listed = cli("models", "list", "--json")
    assert listed.returncode == 0, listed.stderr[-2000:]
    (model,) = json.loads(listed.stdout.splitlines()[-1])
    listed_aliases = {v["version"]: v["aliases"] for v in model["versions"]}
    assert listed_aliases == {"3": ["candidate"], "2": ["champion"], "1": []}
    row = next(line for line in (listed.stdout + listed.stderr).splitlines() if " policy " in line)
    assert row.split()[1:] == ["policy", "│", "3", "│", "2", "(!)", "│", "3", "│", "3", "│"], row
    shown = cli("models", "show", "policy", "--json")
    assert shown.returncode == 0, shown.stderr[-2000:]
    aliases = {v["version"]: v["aliases"] for v in json.loads(shown.stdout.splitlines()[-1])}
    assert aliases == {"3": ["candidate"], "2": ["champion"], "1": []}
