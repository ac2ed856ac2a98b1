"""The rate a policy is gated at is its own (its bundle's ``control_hz``, its robot's), through
``robo-pipe gate``: a 25 Hz bundle's tick deadline is 40 ms on a shipped profile, a profile that
sets a rate overrides it (and the report says so in one line), and a robot of another rate is
refused before any tick (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from deploy_edge.bundle.io_spec import read_io_spec
from robots import spec
from stages.export import export
from stages.policy.checkpoint import new_policy, save_policy
from tests.conftest import TINY_CONFIG
from tests.pipelines.rated_cli import RATED_HZ, RATED_ROBOT, RATED_TASK
from tests.stages.tiny_models import TINY_POLICY, rp5_normalizer

ROOT = Path(__file__).resolve().parents[2]
QUICK = ["--steps", "20", "--warmup", "2", "--no-pace", "--json"]


def cli(module: str, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` (the robo-pipe CLI, or it with the 25 Hz robot registered)."""
    env = {**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def export_25hz(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny policy exported for a 25 Hz robot."""
    root = tmp_path_factory.mktemp("rated")
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, RATED_ROBOT, 6, 6, rp5_normalizer())
    save_policy(policy, root / "ckpt", None)
    with pytest.MonkeyPatch.context() as patch:  # the export states its robot's units
        patch.setitem(spec._REGISTRY, RATED_ROBOT, "tests.pipelines.rated_cli:RP5_25HZ")
        out = Path(export(root / "ckpt", root / "export", RATED_HZ).path)
    assert read_io_spec(out).control_hz == RATED_HZ and read_io_spec(out).robot == RATED_ROBOT
    return out


def test_a_bundle_is_gated_at_its_own_rate_unless_the_profile_overrides_it(
    export_25hz: Path, robo_pipe_home: Path, tmp_path: Path
) -> None:
    config = tmp_path / "rated.yaml"
    rated_task = {"robot": RATED_ROBOT, "scene": {"variant": RATED_TASK}}
    config.write_text(yaml.safe_dump({"extends": str(TINY_CONFIG), **rated_task}))
    rated = "tests.pipelines.rated_cli"

    own = cli(rated, "gate", str(export_25hz), "-c", str(config), *QUICK, home=robo_pipe_home)
    assert own.returncode == 0, own.stderr
    report = json.loads(own.stdout.strip().splitlines()[-1])
    assert report["target"] == "local-cpu" and report["control_hz"] == RATED_HZ
    assert report["deadline_ms"] == pytest.approx(40.0) and report["rate_note"] == ""
    assert "tick deadline 40 ms" in own.stderr and "what-if" not in own.stderr

    what_if = tmp_path / "local-cpu-10hz.yaml"
    profile = yaml.safe_load((ROOT / "configs" / "targets" / "local-cpu.yaml").read_text())
    what_if.write_text(yaml.safe_dump({**profile, "name": "local-cpu-10hz", "control_hz": 10.0}))
    over = cli(rated, "gate", str(export_25hz), "-c", str(config), "--target", str(what_if),
               *QUICK, home=robo_pipe_home)  # fmt: skip
    assert over.returncode == 0, over.stderr
    report = json.loads(over.stdout.strip().splitlines()[-1])
    assert report["control_hz"] == 10.0 and report["deadline_ms"] == pytest.approx(100.0)
    assert "not the bundle's 25 Hz" in report["rate_note"]
    notes = [line for line in over.stderr.splitlines() if "what-if" in line]
    assert len(notes) == 1 and "10 Hz" in notes[0] and "25 Hz" in notes[0], over.stderr
    latency_md = Path(report["report"].replace("$ROBO_PIPE_HOME", str(robo_pipe_home)))
    assert "what-if" in latency_md.read_text()


def test_another_robot_than_the_bundles_is_refused_before_any_tick(
    export_25hz: Path, robo_pipe_home: Path
) -> None:
    """The demo's rp5 is not the 25 Hz robot the bundle was made for: a named error, exit 2, no
    traceback."""
    gate = cli("pipelines.cli", "gate", str(export_25hz), "-c", str(TINY_CONFIG), *QUICK,
               home=robo_pipe_home)  # fmt: skip
    assert gate.returncode == 2, gate.stderr
    assert "robot 'rp5' cannot run a bundle made for robot 'rp5-25hz'" in gate.stderr
    assert "Traceback" not in gate.stderr and not list(robo_pipe_home.rglob("latency_report.json"))
