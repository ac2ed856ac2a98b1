"""The quick start's champion, where a cheap policy that really succeeds is needed.

``robo-pipe run -c configs/quickstart.yaml`` on a fresh home (the README's first command: it ends
promoted and deployed on its local agent); then, through the commands a lab types:

- **A ROS 2 arm** (issue 51): ``robo-pipe deploy models:/quickstart-policy@champion`` onto an
  edge agent whose robot is the digital twin over loopback (``robo-pipe twin --task
  touch-single``; driver ``robots.ros2.driver:ros2_robot``). The deploy's latency gate and
  health check run on the arm, ``robo-pipe devices episode`` runs the champion on it, and the
  twin killed mid-episode holds the arm and ends the episode as a failure with the reason.
- **Success against inference delay** (issue 52): ``robo-pipe gate ... --sweep`` plays the
  held-out suite at delays of 0-16 ticks, sync and async, on the same seeds.

About 3 min on 2 busy cores, most of it the quick start's fine-tuning: the cheapest policy
here that really succeeds (90% held-out), which both need to show anything.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import needs_ros
from tests.pipelines.test_cli import ROOT
from tests.pipelines.test_deploy import TOKEN, start_agent
from tests.pipelines.test_flow import robo_pipe
from tests.robots.test_ros2 import Commands, ros_config, twin_process

MODEL = "quickstart-policy"
QUICKSTART_HANG_S = 900
"""When the quick start's run has hung: it takes ~110 s on 2 quiet cores, and past 300 s once
under the suite's load (a CI run failed on a 300 s bound), so this catches a hang, not a pace."""

# The first test also waits for the quick start (the module's fixture): the default 600 s per
# test would be the run's pace again.
pytestmark = pytest.mark.timeout(QUICKSTART_HANG_S + 600)


@pytest.fixture(scope="module")
def champion(shared_home: Path) -> Path:
    """A home where the quick start ran (``make quickstart``'s command): its champion, and a
    release key (``robo-pipe keys generate``)."""
    done = subprocess.run(  # robo_pipe's, with the quick start's own hang bound
        [sys.executable, "-m", "pipelines.cli", "run", "-c", "configs/quickstart.yaml", "--json"],
        cwd=ROOT,
        env={**os.environ, "ROBO_PIPE_HOME": str(shared_home), "COLUMNS": "200"},
        capture_output=True,
        text=True,
        timeout=QUICKSTART_HANG_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    assert record["promoted"] and record["success_rate"] >= 0.7, record
    assert record["device"]["state"] == "active", "the quick start ends on its local agent"
    made = robo_pipe("keys", "generate", "--name", "release", home=shared_home)
    assert made.returncode == 0, made.stderr
    return shared_home


def episode(home: Path, devices: Path, ticks: int) -> subprocess.Popen[str]:
    """``robo-pipe devices episode`` on the agent, started (``--json``)."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "devices", "episode", "dev-arm-01",
         "--devices", str(devices), "--ticks", str(ticks), "--json"],
        cwd=ROOT, env={**os.environ, "ROBO_PIPE_HOME": str(home), "ARM_TOKEN": TOKEN},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def outcome(run: subprocess.Popen[str]) -> tuple[dict[str, Any], str]:
    """The episode's record and its stderr, once it ended (no traceback either way)."""
    out, err = run.communicate(timeout=180)
    assert out.strip(), f"no episode record: {err[-3000:]}"
    assert "Traceback" not in out + err, (out, err)
    return json.loads(out.strip().splitlines()[-1]), err


@needs_ros
def test_the_quick_starts_champion_succeeds_on_a_ros2_arm_and_a_lost_arm_ends_it(
    champion: Path, tmp_path: Path
) -> None:
    config = ros_config(tmp_path)
    # The policy's camera size: the twin renders it as the simulator it learned in did.
    twin = twin_process(config, "--task", "touch-single", "--seed", "1", "--image-size", "32")
    commands = Commands(config)  # what the arm's controller receives
    started = start_agent(
        champion,
        tmp_path,
        driver="robots.ros2.driver:ros2_robot",
        driver_args={"config": str(config)},  # the twin plays its next seed each episode
        pace=True,  # a real arm's rate: the twin publishes at 10 Hz
    )
    try:
        key = str(champion / "keys" / "release.key")
        target = ("--device", "dev-arm-01", "--devices", str(started["devices"]))
        done = robo_pipe(
            "deploy", f"models:/{MODEL}@champion", *target, "--key", key,
            home=champion, ARM_TOKEN=TOKEN,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]

        # Whole episodes (50 ticks, 5 s; touch-single's expert needs ~9 ticks) until 5
        # succeed, at most 10. The champion plays touch-single ~84% in simulation: all 10 fail
        # that bar ~0.2% of the time. An untrained policy (~9% here) passes it ~0.1%; one at 20%
        # (an arm driven from wrong images or joints) ~3%.
        records: list[dict[str, Any]] = []
        while len(records) < 10 and sum(r["success"] for r in records) < 5:
            run = episode(champion, started["devices"], 50)
            record, err = outcome(run)
            assert record["version"].startswith(f"{MODEL}:") and record["errors"] == 0, record
            assert run.returncode == (0 if record["success"] else 1), (record, err)
            records.append(record)
        solved = [r for r in records if r["success"]]
        ticks = [r["ticks"] for r in records]
        print(f"over ROS 2: {len(solved)} of {len(records)} episodes succeeded, ticks {ticks}")
        assert len(solved) == 5, records
        assert all(r["ticks"] < 50 and not r["reason"] for r in solved), records

        run = episode(champion, started["devices"], 300)  # 30 s at 10 Hz: the twin dies first
        asked = time.monotonic()
        # Killed once the episode drives the arm (its first commands), however long the
        # CLI, the agent and the connect took on a busy machine.
        while len(commands.since(asked)) < 3 and run.poll() is None:
            assert time.monotonic() < asked + 120, "the episode never drove the arm"
            time.sleep(0.05)
        twin.kill()
        record, err = outcome(run)
        assert run.returncode == 1, (record, err)
        assert record["success"] is False and record["reason"].startswith("lost /"), record
        assert "ended by the robot: lost /" in err and record["ticks"] < 100, record
        assert record["misses"] >= 1, "the stale ticks held the arm and count as misses"
    finally:
        started["process"].terminate()
        started["process"].wait(timeout=20)
        twin.kill()
        twin.wait(timeout=20)
        commands.ros.close()


def test_gate_sweeps_success_against_inference_delay_on_the_same_seeds(champion: Path) -> None:
    """``robo-pipe gate --sweep``: zero delay is today's evaluation (the same seeds, the same
    outcome as ``robo-pipe evaluate``), a delay the policy cannot hold loses what zero delay
    won, async is not played where its chunk cannot cover the delay (the runtime's rule), and
    the delay of the measured p99 is played and marked, in the table, the JSON and the plot."""
    from deploy_edge.async_loop import inference_ticks
    from deploy_edge.targets import load_target

    model, config = (
        f"models:/{MODEL}@champion",
        ("-c", "configs/quickstart.yaml", "--episodes", "20"),
    )
    done = robo_pipe("gate", model, *config, "--sweep", "--steps", "30", "--json", home=champion)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads(done.stdout.strip().splitlines()[-1])
    sweep = record["delay_sweep"]
    points = {(p["mode"], p["ticks"]): p for p in sweep["points"]}
    today = robo_pipe("evaluate", model, *config, "--json", home=champion)
    assert today.returncode == 0, today.stderr[-3000:]
    evaluated = json.loads(today.stdout.strip().splitlines()[-1])

    zero = points["sync", 0]
    assert zero["episodes"] == evaluated["episodes"] == 20 * len(sweep["variants"])
    assert zero["successes"] == evaluated["successes"], (zero, evaluated["successes"])
    assert points["async", 0]["successes"] == zero["successes"], "d = 0 is one play"
    assert zero["success_rate"] >= 0.7, "the champion succeeds at zero delay"
    assert points["sync", 16]["success_rate"] <= zero["success_rate"] - 0.5, points["sync", 16]

    chunk = sweep["chunk_len"]  # the runtime's rule: a chunk covers 2 d
    for (mode, d), point in points.items():
        played = point["refused"] == ""
        assert played == (mode == "sync" or 2 * d <= chunk), point
        assert not played or point["episodes"] == zero["episodes"], point
        assert played or f"a chunk of {chunk} actions" in point["refused"], point

    p99 = record["inference_p99_ms"] or record["p99_ms"]
    margin_s = load_target(record["target"]).inference_margin_ms / 1000  # the device's runtime
    expected = inference_ticks(p99 / 1000, margin_s, 0.1)  # 10 Hz
    assert sweep["expected_ticks"] == expected and ("sync", expected) in points
    assert {0, 2, 4, 8, 12, 16} <= {d for _, d in points}
    run_dir = Path(record["report"]).parent
    table = (run_dir / "delay_sweep.md").read_text()
    assert f"{expected} ticks ({expected * 100:g} ms) <- the device's" in table, table
    assert (run_dir / "delay_sweep.png").stat().st_size > 10_000
    # Where real VLAs would sit: the 250 M preset's measured CPU p99, a published Jetson one.
    marks = {m["label"]: m for m in sweep["marks"]}
    preset = marks["256M preset, this CPU, 1 thread"]
    assert preset["ticks"] == inference_ticks(preset["inference_ms"] / 1000, margin_s, 0.1) >= 15
    assert marks["GR00T N1.5 3B, Jetson AGX Orin"]["ticks"] == 1
    assert f"256M preset, this CPU, 1 thread: 1431 ms = {preset['ticks']} ticks" in table
    shown = " ".join(done.stderr.split())
    assert "delay sweep: ok" in shown, shown[-2000:]


def slow_sync(folder: Path, added_ms: float) -> Path:
    """A what-if target profile, ``slow-sync``: this machine's engine ``added_ms`` slower per
    inference (``added_inference_ms``), run sync with its late ticks not judged (the robot
    waits for each inference)."""
    profile = {
        "name": "slow-sync",
        "description": "what-if: a slower device, run sync",
        "mode": "sync",
        "budget_ms": 5000.0,
        "allowed_misses": 100000,
        "added_inference_ms": added_ms,
    }
    path = folder / f"slow-sync-{added_ms:g}.yaml"
    path.write_text(json.dumps(profile))  # JSON is YAML
    return path


def test_a_target_too_slow_for_the_champion_blocks_it_and_a_slower_device_refuses_it(
    champion: Path, tmp_path: Path
) -> None:
    """Issue 52: on a target whose inference takes ~350 ms (sync: the robot holds ~4 ticks
    for every action) the quick start's champion, 90% at zero delay, is blocked by the
    ``success at device latency`` gate alone, on figures the runtime measured, and the
    champion check at that target says it regressed; its release records that inference, and
    a device of the same profile whose engine is slower still (~550 ms: 6 ticks against 4) refuses
    it, naming both figures."""
    from deploy_edge.async_loop import inference_ticks

    gated = robo_pipe(
        "run", "-c", "configs/quickstart.yaml", "--json",
        "--set", f"latency.target={slow_sync(tmp_path, 350)}", home=champion,
    )  # fmt: skip
    assert gated.returncode == 1, gated.stderr[-3000:]
    record = json.loads(gated.stdout.strip().splitlines()[-1])
    assert record["blocked_by"] == ["success at device latency"], record
    folder = Path(record["run_dir"]) / "latency"
    latency = json.loads((folder / "latency_report.json").read_text())
    assert latency["passed"] and latency["target"] == "slow-sync", latency
    at = json.loads((folder / "at_device_delay.json").read_text())
    ticks = inference_ticks(latency["p99_ms"] / 1000, 0.0, 0.1)  # sync: the tick's p99
    assert at["ticks"] == ticks >= 4 and at["mode"] == "sync", at
    assert at["inference_ms"] == latency["p99_ms"] > 350, "the runtime's figure, not the setting"
    zero = record["success_rate"]
    assert zero >= 0.7 and at["success_rate"] <= zero - 0.15, (zero, at["success_rate"])
    assert at["vs_zero"]["decision"] == "worse" or at["ci95"][0] < 0.7, at
    gate = record["gates"]["success at device latency"]
    assert f"= {ticks} ticks of 100 ms" in gate["measured"] and not gate["passed"], gate
    summary = (Path(record["run_dir"]) / "summary.md").read_text()
    assert "success at device latency" in summary, summary

    # The champion check re-judges the champion at the config's target now: held at zero
    # delay, regressed at this one.
    check = robo_pipe(
        "models", "check", "-c", "configs/quickstart.yaml",
        "--set", f"latency.target={slow_sync(tmp_path, 350)}", home=champion,
    )  # fmt: skip
    verdict = " ".join(check.stdout.split())
    assert check.returncode == 1 and "Traceback" not in check.stderr, check.stderr[-3000:]
    assert f"regression: champion {MODEL} v" in verdict, verdict[-3000:]
    assert "at slow-sync's delay:" in verdict and "ticks of 100 ms" in verdict, verdict[-3000:]

    # The device: the same profile, ~200 ms slower still. Its own gate passes (late ticks
    # are not judged on this profile); the release's recorded inference refuses it.
    started = start_agent(
        champion, tmp_path, target=str(slow_sync(tmp_path, 550)),
        gate_steps=8, gate_warmup=1, health_ticks=2,
    )  # fmt: skip
    try:
        key = str(champion / "keys" / "release.key")
        refused = robo_pipe(
            "deploy", f"models:/{MODEL}@champion", "--device", "dev-arm-01",
            "--devices", str(started["devices"]), "--key", key, home=champion, ARM_TOKEN=TOKEN,
        )  # fmt: skip
    finally:
        started["process"].terminate()
        started["process"].wait(timeout=20)
    said = " ".join(refused.stderr.split())
    assert refused.returncode != 0 and "Traceback" not in said, said[-3000:]
    recorded = float(f"{latency['p99_ms']:.3f}")  # as the version's tag keeps it
    assert f"gated on slow-sync at {recorded:.1f} ms ({ticks} ticks)" in said, said[-3000:]
    assert re.search(r"inference p99 (\d+\.\d) ms on this device, (\d+) ticks", said), said
