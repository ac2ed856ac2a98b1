"""Meta-World through the whole pipeline from the CLI: ``robo-pipe run -c
configs/metaworld-tiny.yaml`` (two MT10 tasks) collects with Meta-World's scripted experts,
pretrains, fine-tunes, exports, evaluates per task, gates, registers and deploys onto the local
edge agent, whose episode plays Meta-World; every record on the way is the Sawyer's (its rate,
state, action, camera), never rp5's. Bad input (a missing Meta-World environment, an unknown
task, a policy of another robot) is refused by name before any work.

One run of the tiny config (~90 s on 2 cores, most of it evaluating 100-step episodes of a
policy that has learnt little) serves every test of the module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from robots.sawyer import SAWYER
from sim_scenes.metaworld.env import ENV_VAR
from sim_scenes.metaworld.tasks import METAWORLD
from stages.dataset.reader import open_dataset
from tests.conftest import needs_metaworld

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "metaworld-tiny.yaml")
LEROBOT_PYTHON = os.environ.get("ROBO_PIPE_LEROBOT_PYTHON")


def robo_pipe(*args: str, home: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=900,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tiny Meta-World config end to end on a fresh home, its BC followed by PPO on
    ``configs/metaworld-rl.yaml``'s reward terms (two iterations, on Ray), held to no success
    bar (its policy trains for 10 steps) so that it is promoted and deployed."""
    home = tmp_path_factory.mktemp("metaworld") / "home"
    result = robo_pipe(
        "run",
        "-c",
        CONFIG,
        *("--set", "registry.promotion.min_success=0.0"),
        *("--set", "finetune.algo=ppo", "--set", "scene.reward.progress_weight=10.0"),
        "--json",
        home=home,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return home, json.loads(result.stdout.strip().splitlines()[-1])


@needs_metaworld
def test_two_meta_world_tasks_run_end_to_end_on_the_sawyer(
    run: tuple[Path, dict[str, Any]],
) -> None:
    home, record = run
    assert record["promoted"] and record["verdict"] == "promoted", record["blocked_by"]
    assert set(record["stages"]) >= {"collect", "pretrain", "finetune", "export", "evaluate"}
    assert set(record["stages"]) >= {"latency", "register", "deploy"}

    # The dataset is the Sawyer's at its 80 Hz, in Meta-World's words.
    dataset = open_dataset(record["dataset"])
    info = json.loads((Path(record["dataset"]) / "meta" / "info.json").read_text())
    assert info["fps"] == SAWYER.control_hz == 80.0
    assert info["features"]["action"]["names"] == list(SAWYER.action.names)
    assert info["features"]["observation.state"]["names"] == list(SAWYER.state_names)
    assert "observation.images.workspace" in info["features"]
    env_state = info["features"]["observation.environment_state"]["names"]
    assert env_state == list(METAWORLD.env_state_names)
    assert set(dataset.tasks) <= set(METAWORLD.instructions()) and len(dataset.tasks) >= 2

    # The export states the Sawyer's rate, sizes, camera and units.
    spec = json.loads((Path(record["export"]) / "io_spec.json").read_text())
    assert spec["robot"] == "sawyer" and spec["control_hz"] == 80.0
    assert (spec["state_dim"], spec["action_dim"], spec["cameras"]) == (7, 4, ["workspace"])

    # PPO fine-tuned the BC warm start in Meta-World's rollouts; evaluation reports each
    # task on its own row, failures in the family's own modes, for both on the same seeds.
    assert "-ppo-" in record["checkpoint"] and record["warm_start_success_rate"] is not None
    seeds, solved = [], []
    assert record["start_success_rate"] is None, "evaluate.play_start: false"
    assert not (Path(record["run_dir"]) / "evaluate-start").exists()
    for folder in ("evaluate", "evaluate-warm-start"):
        report = json.loads((Path(record["run_dir"]) / folder / "eval_report.json").read_text())
        rows = {row["variant"]: row for row in report["rows"]}
        assert set(rows) == {"metaworld/reach", "metaworld/button-press-topdown"}
        modes = {mode.name for mode in METAWORLD.failure_modes}
        for row in rows.values():
            counted = {k: v for k, v in row["failures"].items() if k in modes}
            assert sum(counted.values()) == row["episodes"] - row["successes"]
        seeds.append(report["seeds"])
        solved.append({(o["variant"], o["index"]): o["success"] for o in report["outcomes"]})
    assert seeds[0] == seeds[1], "the BC start and the RL result play the same seeds"
    # The paired test of RL's gain counts the seeds only one of them solved.
    rl, bc = solved
    gain = record["rl_gain"]
    assert gain["discordant"] == {
        "candidate_only": sum(bc[k] and not rl[k] for k in rl),  # the BC start is its candidate
        "baseline_only": sum(rl[k] and not bc[k] for k in rl),
    }
    summary = (Path(record["run_dir"]) / "summary.md").read_text()
    assert f"Paired: RL alone solved {gain['discordant']['baseline_only']} seeds" in summary

    # The local edge agent's robot plays Meta-World's tasks, the champion's instruction.
    device = yaml.safe_load((home / "edge" / "local-agent" / "device.yaml").read_text())
    assert device["driver_args"] == {"task": "metaworld/mt2"}
    assert device["instruction"] in METAWORLD.instructions()
    assert record["device"]["state"] == "active" and record["device"]["episode_ticks"] == 10


@needs_metaworld
@pytest.mark.skipif(
    not LEROBOT_PYTHON,
    reason="LeRobot is not installed: `make test` builds it and sets ROBO_PIPE_LEROBOT_PYTHON",
)
def test_lerobot_reads_the_meta_world_dataset(run: tuple[Path, dict[str, Any]]) -> None:
    _, record = run
    result = subprocess.run(
        [str(LEROBOT_PYTHON), str(ROOT / "tests/stages/compat/lerobot_load.py"), record["dataset"]],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    ours = open_dataset(record["dataset"])
    assert (seen["num_frames"], seen["num_episodes"]) == (ours.num_frames, ours.num_episodes)
    assert seen["fps"] == 80 and seen["camera_keys"] == ["observation.images.workspace"]
    assert all(task in METAWORLD.instructions() for task in seen["tasks"])


@needs_metaworld
def test_bad_meta_world_input_is_named_before_any_work(
    run: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    _, record = run
    home = tmp_path / "home"
    missing = robo_pipe("run", "-c", CONFIG, home=home, **{ENV_VAR: str(tmp_path / "py")})
    assert missing.returncode == 2 and "make metaworld-env" in missing.stderr
    unknown = robo_pipe("run", "-c", CONFIG, "--set", "scene.variant=metaworld/reach-v9", home=home)
    assert unknown.returncode == 2 and "unknown task 'metaworld/reach-v9'" in unknown.stderr
    assert "metaworld/mt10" in unknown.stderr, "the valid tasks are listed"
    # The Sawyer's policy on the touch task (rp5's): refused before an episode is played.
    other = robo_pipe("evaluate", record["export"], "-c", "configs/tiny.yaml", home=home)
    assert other.returncode == 2
    assert "a policy for robot 'sawyer' cannot act for robot 'rp5'" in other.stderr
    for result in (missing, unknown, other):
        assert "Traceback" not in result.stderr
    assert not home.exists() or not any((home / "datasets").glob("*")), "nothing collected"
