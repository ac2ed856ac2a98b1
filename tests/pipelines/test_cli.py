"""Subprocess smoke tests of the robo-pipe CLI verbs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def robo_pipe(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_help_lists_only_working_verbs(robo_pipe_home: Path) -> None:
    result = robo_pipe("--help", home=robo_pipe_home)
    assert result.returncode == 0, result.stderr
    commands = result.stdout.split("Commands")[1]
    verbs = {line.split()[1] for line in commands.splitlines() if line.startswith("│ ")}
    assert verbs == {"demo", "collect", "config", "robots", "scenes"}


def test_demo_writes_report_images_and_json_record(robo_pipe_home: Path) -> None:
    result = robo_pipe(
        "demo",
        "configs/demo.yaml",
        "--episodes",
        "6",
        "--set",
        "sim.num_envs=3",
        "--json",
        home=robo_pipe_home,
    )
    assert result.returncode == 0, result.stderr
    record = json.loads(result.stdout.strip().splitlines()[-1])
    assert record["episodes"] == 6
    assert record["success_rate"] >= 0.5
    run_dir = Path(record["run_dir"])
    assert run_dir.parent == robo_pipe_home / "runs"
    for name in (
        "config.yaml",
        "report.md",
        "expert_filmstrip.png",
        "expert_episodes.gif",
        "result.json",
    ):
        assert (run_dir / name).is_file(), name
    assert "num_envs: 3" in (run_dir / "config.yaml").read_text()


def test_bad_config_exits_2_and_names_the_problem(robo_pipe_home: Path) -> None:
    result = robo_pipe("demo", "configs/demo.yaml", "--set", "sim.num_envs=-1", home=robo_pipe_home)
    assert result.returncode == 2
    assert "field 'sim.num_envs' = -1" in result.stderr
    missing = robo_pipe("config", "configs/missing.yaml", home=robo_pipe_home)
    assert missing.returncode == 2
    assert "config file not found" in missing.stderr


def test_config_robots_and_scenes_verbs(robo_pipe_home: Path) -> None:
    shown = robo_pipe("config", "configs/demo-wrist.yaml", home=robo_pipe_home)
    assert shown.returncode == 0, shown.stderr
    assert "- wrist" in shown.stdout and "config hash" in shown.stdout
    robots_out = robo_pipe("robots", "--json", home=robo_pipe_home)
    assert json.loads(robots_out.stdout.splitlines()[-1])[0]["name"] == "rp5"
    scenes_out = robo_pipe("scenes", "--json", home=robo_pipe_home)
    splits = {s["name"]: s["split"] for s in json.loads(scenes_out.stdout.splitlines()[-1])}
    assert splits["touch-mixed"] == "train" and "heldout" in splits.values()
