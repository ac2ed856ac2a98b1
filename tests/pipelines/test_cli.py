"""Subprocess smoke tests of the robo-pipe CLI verbs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import TINY_CONFIG

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
    rows = [line for line in commands.splitlines() if line.startswith("│ ") and line[2] != " "]
    verbs = {line.split()[1] for line in rows}  # a wrapped help line starts with spaces
    assert verbs == {
        "expert",
        "collect",
        "pretrain",
        "finetune",
        "evaluate",
        "export",
        "gate",
        "run",
        "serve",
        "ui",
        "info",
        "models",
        "keys",
        "bundle",
        "edge-agent",
        "deploy",
        "fleet",
        "devices",
        "verify",
        "twin",
        "import",
        "assets",
        "config",
        "robots",
        "scenes",
    }


def test_help_paragraphs_wrap_to_the_terminal(robo_pipe_home: Path) -> None:
    """At 80 columns a verb's description is wrapped as paragraphs, not broken again at each
    of its docstring's line ends (Typer's rich mode kept those: "scene.variant) x" alone on a
    line), and placeholders survive the markup (models:/NAME@ALIAS)."""
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "evaluate", "--help"],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(robo_pipe_home), "COLUMNS": "80"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    description = result.stdout.split("Usage:")[1].split("╭")[0]
    lines = [line.strip() for line in description.splitlines()[1:]]  # after the usage line
    paragraphs = "\n".join(lines).strip().split("\n\n")
    assert len(paragraphs) >= 3, description
    for paragraph in paragraphs:
        rows = paragraph.splitlines()
        assert all(len(row) >= 60 for row in rows[:-1]), rows  # full lines but the last
    assert "models:/NAME@ALIAS" in result.stdout


def test_expert_writes_report_images_and_json_record(robo_pipe_home: Path) -> None:
    result = robo_pipe(
        "expert",
        "--config",
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
    result = robo_pipe("expert", "--set", "sim.num_envs=-1", home=robo_pipe_home)
    assert result.returncode == 2
    assert "field 'sim.num_envs' = -1" in result.stderr
    missing = robo_pipe("config", "--config", "configs/missing.yaml", home=robo_pipe_home)
    assert missing.returncode == 2
    assert "config file not found" in missing.stderr


def test_config_robots_and_scenes_verbs(robo_pipe_home: Path) -> None:
    shown = robo_pipe("config", "-c", "configs/demo-wrist.yaml", home=robo_pipe_home)
    assert shown.returncode == 0, shown.stderr
    assert "- wrist" in shown.stdout and "config hash" in shown.stdout
    robots_out = robo_pipe("robots", "--json", home=robo_pipe_home)
    rp5, sawyer = json.loads(robots_out.stdout.splitlines()[-1])
    assert (rp5["name"], rp5["action"]["kinds"]) == ("rp5", ["delta"] * 5 + ["absolute"])
    assert (sawyer["name"], sawyer["control_hz"]) == ("sawyer", 80.0)
    assert sawyer["action"]["kinds"] == ["delta", "delta", "delta", "effort"]
    table = robo_pipe("robots", home=robo_pipe_home)  # a declared robot has no joints to list
    assert table.returncode == 0 and "gripper.effort" in table.stdout, table.stderr
    assert "control: 80 Hz; cameras: corner" in table.stdout
    scenes_out = robo_pipe("scenes", "--json", home=robo_pipe_home)
    listed = json.loads(scenes_out.stdout.splitlines()[-1])
    splits = {s["name"]: s["split"] for s in listed}
    assert splits["touch-mixed"] == "train" and "heldout" in splits.values()
    assert {(s["family"], s["robot"]) for s in listed} == {
        ("touch", "rp5"),
        ("metaworld", "sawyer"),
    }
    assert splits["metaworld/mt10"] == "train" and "metaworld/reach" in splits


def test_pretrain_then_finetune_print_checkpoint_records(robo_pipe_home: Path) -> None:
    pre = robo_pipe("pretrain", "--config", str(TINY_CONFIG), "--json", home=robo_pipe_home)
    assert pre.returncode == 0, pre.stderr
    base = json.loads(pre.stdout.strip().splitlines()[-1])
    assert base["trainable"] == "all" and base["step"] == 10
    assert Path(base["path"]).is_relative_to(robo_pipe_home / "checkpoints")

    base_written = (Path(base["path"]) / "policy.json").stat().st_mtime_ns
    fine = robo_pipe("finetune", "--config", str(TINY_CONFIG), "--json", home=robo_pipe_home)
    assert fine.returncode == 0, fine.stderr
    assert (Path(base["path"]) / "policy.json").stat().st_mtime_ns == base_written
    ref = json.loads(fine.stdout.strip().splitlines()[-1])
    assert ref["trainable"] == "lora" and ref["step"] == 10
    assert ref["base"]["hash"] == base["content_hash"], "the cached base is reused"
    assert ref["config_hash"] and ref["metrics"]["samples_per_s"] > 0
    datasets = list((robo_pipe_home / "datasets").glob("demo-touch-mixed-*/meta/info.json"))
    assert len(datasets) == 1, "the config's dataset, collected on the way"


def test_bad_training_config_and_dataset_are_named(robo_pipe_home: Path) -> None:
    bad = robo_pipe("finetune", "--set", "finetune.trainable=half", home=robo_pipe_home)
    assert bad.returncode == 2
    assert "finetune.trainable" in bad.stderr and "'half'" in bad.stderr
    leak = robo_pipe(
        "pretrain",
        "--set",
        "pretrain.variants=[touch-cubes,touch-mixed]",
        home=robo_pipe_home,
    )
    assert leak.returncode == 2 and "includes the target variant" in leak.stderr
    missing = robo_pipe(
        "finetune",
        "--set",
        "policy.type=hub-vlm",
        "--set",
        f"policy.backbone={robo_pipe_home}",
        "--dataset",
        str(robo_pipe_home / "nowhere"),
        home=robo_pipe_home,
    )
    assert missing.returncode == 2 and "nowhere" in missing.stderr


def test_export_gate_and_evaluate_the_export(robo_pipe_home: Path, tmp_path: Path) -> None:
    import torch

    from stages.policy.checkpoint import new_policy, save_policy
    from tests.stages.tiny_models import TINY_POLICY, rp5_normalizer

    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6, rp5_normalizer())
    save_policy(policy, tmp_path / "ckpt", None)
    export = robo_pipe("export", str(tmp_path / "ckpt"), "--json", home=robo_pipe_home)
    assert export.returncode == 0, export.stderr
    ref = json.loads(export.stdout.strip().splitlines()[-1])
    assert ref["parity"]["random"] < 1e-4 and Path(ref["onnx"]).is_file()
    quick = ["--steps", "40", "--warmup", "2", "--no-pace", "--json"]
    gate = robo_pipe("gate", ref["path"], *quick, home=robo_pipe_home)
    assert gate.returncode == 0, gate.stderr
    report = json.loads(gate.stdout.strip().splitlines()[-1])
    assert report["passed"] and report["steps"] == 40 and report["target"] == "local-cpu"
    tight = robo_pipe("gate", ref["path"], *quick, "--budget-ms", "0.001", home=robo_pipe_home)
    assert tight.returncode == 1 and "FAILED" in tight.stderr and "p99" in tight.stderr
    missing = robo_pipe("gate", str(tmp_path), "--target", "jetson-nano-2014", home=robo_pipe_home)
    assert missing.returncode == 2 and "unknown target" in missing.stderr

    small = [
        "--episodes",
        "2",
        "--set",
        "evaluate.workers=0",
        "--set",
        "evaluate.envs_per_worker=2",
    ]
    evaluate = robo_pipe("evaluate", ref["path"], *small, "--json", home=robo_pipe_home)
    assert evaluate.returncode == 0, evaluate.stderr
    report = json.loads(evaluate.stdout.strip().splitlines()[-1])
    assert report["episodes"] == 4 and len(report["rows"]) == 2 and Path(report["report"]).is_file()
    registry = robo_pipe("evaluate", "models:/demo@champion", home=robo_pipe_home)
    assert registry.returncode == 2 and "models:/demo@champion: no registry yet" in registry.stderr


def test_a_user_error_exits_2_naming_the_input_before_any_work(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    """Each is a RoboPipeError: one line naming the path, exit 2, no traceback, nothing made."""
    a_file = tmp_path / "notes.txt"
    a_file.write_text("not a dataset folder")
    collect = robo_pipe("collect", "--out", str(a_file), home=robo_pipe_home)
    assert collect.returncode == 2, collect.stderr
    assert str(a_file) in collect.stderr and "is a file" in collect.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    finetune = robo_pipe("finetune", "--dataset", str(empty), home=robo_pipe_home)
    assert finetune.returncode == 2, finetune.stderr
    assert str(empty) in finetune.stderr
    for result in (collect, finetune):
        assert "Traceback" not in result.stderr
    assert not list((robo_pipe_home / "checkpoints").glob("*")), "no pretraining started"
    assert not list((robo_pipe_home / "datasets").glob("*")), "no collection started"


def test_a_bug_shows_its_traceback_and_exits_3(robo_pipe_home: Path) -> None:
    """Anything that is not a RoboPipeError is robo-pipe's fault: the traceback stays, and
    the exit code (3) is neither a verdict's (1) nor bad input's (2)."""
    bug = (
        "import sys; import pipelines.steps.collect as steps\n"
        "def broken(*args, **kwargs): raise KeyError('episode_index')\n"
        "steps.collect_dataset = broken\n"
        "sys.argv = ['robo-pipe', 'collect']\n"
        "from pipelines.cli import main; main()\n"
    )
    env = {**os.environ, "ROBO_PIPE_HOME": str(robo_pipe_home)}
    result = subprocess.run(
        [sys.executable, "-c", bug], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 3
    assert "Traceback" in result.stderr and "KeyError: 'episode_index'" in result.stderr


def test_evaluate_exits_1_when_the_policy_is_worse_than_its_baseline(
    robo_pipe_home: Path, export_dir: Path, tmp_path: Path
) -> None:
    """`robo-pipe evaluate --baseline`: a blocked comparison fails the command. Success here is
    the tool centre point held within 30 cm of the target for 30 steps: a policy that keeps the
    arm still solves every seed, the tiny random export drives it away on every one. Against
    its baseline it is blocked (exit 1, still with its record); against itself it is not."""
    import torch

    from stages.policy.checkpoint import new_policy, save_policy
    from tests.stages.tiny_models import TINY_POLICY

    still, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    with torch.no_grad():  # zero actions: the arm holds its start pose
        still.action_head.weight.zero_()
        still.action_head.bias.zero_()
    save_policy(still, tmp_path / "still", None)
    sets = [
        "scene.success.radius=0.3",
        "scene.success.hold_steps=30",
        "scene.episode_steps=35",
        "evaluate.envs_per_worker=6",
    ]
    tiny = ["--config", str(TINY_CONFIG), "--episodes", "6"]
    args = [*tiny, *(arg for s in sets for arg in ("--set", s)), "--json"]

    worse = robo_pipe(
        "evaluate",
        str(export_dir),
        "--baseline",
        str(tmp_path / "still"),
        *args,
        home=robo_pipe_home,
    )
    assert worse.returncode == 1, worse.stderr[-3000:]
    report = json.loads(worse.stdout.strip().splitlines()[-1])
    assert report["success_rate"] == 0.0 and report["comparison"]["baseline_success_rate"] == 1.0
    assert not report["comparison"]["passed"]
    shown = " ".join(worse.stderr.split())
    assert f"blocked: {export_dir} is worse than the baseline {tmp_path / 'still'}" in shown
    assert "exit code 1" in shown and "Traceback" not in shown

    same = robo_pipe(
        "evaluate", str(export_dir), "--baseline", str(export_dir), *args, home=robo_pipe_home
    )
    assert same.returncode == 0, same.stderr[-3000:]
    assert json.loads(same.stdout.strip().splitlines()[-1])["comparison"]["passed"]
    assert "blocked" not in same.stderr
