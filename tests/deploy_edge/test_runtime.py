"""The control loop and the latency gate on the simulated robot; the export needs no training
code; a stalling or failing engine holds the robot safe; a bad I/O spec is refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from deploy_edge.exported import ExportedPolicy, IOSpecError
from deploy_edge.latency import run_gate, verdict
from deploy_edge.latency_report import LatencyReport
from deploy_edge.runtime import ControlLoop
from deploy_edge.targets import TargetError, available_targets, load_target
from robots.interface import RobotObservation
from robots.spec import RobotSpec
from sim_scenes.sim_robot import SimulatedRobot
from sim_scenes.touch import get_variant

ROOT = Path(__file__).resolve().parents[2]


class RecordingRobot(SimulatedRobot):
    """The simulated robot, remembering every state it was observed in and every action it
    was sent."""

    def __init__(self, spec: RobotSpec) -> None:
        super().__init__(
            spec, get_variant("touch-mixed"), seed=3, cameras=("scene",), image_size=32
        )
        self.sent: list[np.ndarray] = []
        self.observed: list[np.ndarray] = []

    def observe(self) -> RobotObservation:
        obs = super().observe()
        self.observed.append(obs.state.copy())
        return obs

    def act(self, action: np.ndarray) -> None:
        self.sent.append(np.asarray(action, dtype=np.float32).copy())
        super().act(action)


class StallingPolicy:
    """A test engine: fixed chunks, but its ``stall_on``-th call sleeps past the deadline (or
    raises, with ``fail=True``)."""

    chunk_len = 4

    def __init__(self, stall_on: int, seconds: float = 0.0, fail: bool = False) -> None:
        self.calls, self.stall_on, self.seconds, self.fail = 0, stall_on, seconds, fail

    def infer(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> np.ndarray:
        self.calls += 1
        if self.calls == self.stall_on:
            if self.fail:
                raise RuntimeError("engine fault")
            time.sleep(self.seconds)
        return np.full((1, self.chunk_len, 6), 0.01, dtype=np.float32)


@pytest.mark.parametrize("fail", [False, True])
def test_a_stalled_or_failed_engine_sends_the_safe_action(rp5: RobotSpec, fail: bool) -> None:
    robot = RecordingRobot(rp5)
    robot.connect()
    try:
        loop = ControlLoop(
            StallingPolicy(3, 0.05, fail),
            robot,
            "touch the red cube",
            execute=2,
            deadline_s=0.02,
            pace=False,
        )
        ticks = loop.run(8)
    finally:
        robot.stop()
    # execute=2: inference on ticks 0, 2, 4 (the 3rd call stalls or fails: the queue is
    # dropped), then 5, 7
    stalled = not fail  # a stalled call still returned a chunk; a failed one did not
    assert [t.inferred for t in ticks] == [True, False, True, False, stalled, True, False, True]
    assert [t.missed for t in ticks] == [False, False, False, False, True, False, False, False]
    assert ticks[4].error == ("RuntimeError: engine fault" if fail else "")
    safe = robot.sent[4]
    assert np.all(safe[:5] == 0.0), "no joint motion"
    assert all(np.allclose(a, 0.01) for i, a in enumerate(robot.sent) if i != 4)


def test_gate_passes_at_100_ms_and_fails_below_the_measured_latency(
    rp5: RobotSpec, export_dir: Path, tmp_path: Path
) -> None:
    assert {"local-cpu", "jetson-orin-nano", "jetson-agx-orin", "jetson-thor"} <= set(
        available_targets()
    )
    target = load_target("local-cpu")
    policy = ExportedPolicy(export_dir)
    robot = RecordingRobot(rp5)
    report = run_gate(
        export_dir,
        robot,
        "touch the red cube",
        target,
        steps=200,
        warmup=10,
        pace=False,
        out=tmp_path,
        policy=policy,
    )
    assert report.passed and report.reasons == [] and report.budget_ms == 100.0
    assert report.p50_ms <= report.p95_ms <= report.p99_ms <= report.max_ms
    assert report.misses == 0 and report.inference_ticks == 200
    assert report.measured_on["engine"].startswith("onnxruntime")
    assert Path(report.histogram).is_file() and "PASSED" in Path(report.report).read_text()
    written = json.loads((tmp_path / "latency_report.json").read_text())
    assert LatencyReport.from_json(written) == report
    tight = run_gate(
        export_dir,
        robot,
        "touch the red cube",
        target,
        steps=50,
        warmup=5,
        budget_ms=report.p50_ms / 10,
        pace=False,
        policy=policy,
    )
    assert not tight.passed and "p99" in tight.reasons[0] and "> budget" in tight.reasons[0]


def test_verdict_percentiles_and_both_limits_at_their_boundaries() -> None:
    ms = np.arange(1.0, 101.0)  # 1, 2, ..., 100 ms
    v = verdict(ms, misses=2, budget_ms=99.01, allowed_misses=2)
    # numpy's linear interpolation: p50 = 50.5, p95 = 95.05, p99 = 99.01
    assert v["p50_ms"] == pytest.approx(50.5) and v["p95_ms"] == pytest.approx(95.05)
    assert v["p99_ms"] == pytest.approx(99.01) and v["max_ms"] == 100.0
    assert v["mean_ms"] == pytest.approx(50.5)
    assert v["jitter_ms"] == pytest.approx((9999 / 12) ** 0.5)  # std of 1..n: sqrt((n^2-1)/12)
    assert v["passed"] and v["reasons"] == [] and v["misses"] == 2, "both limits are inclusive"
    over = verdict(ms, misses=3, budget_ms=99.0, allowed_misses=2)
    assert not over["passed"]
    assert over["reasons"] == ["p99 99.01 ms > budget 99 ms", "3 deadline misses > 2 allowed"]
    assert verdict(ms, 3, 200.0, 2)["reasons"] == ["3 deadline misses > 2 allowed"]


class StallingExport(ExportedPolicy):
    """The real export, but its ``stall_on``-th inference calls sleep ``seconds`` first."""

    def __init__(self, export_dir: Path, stall_on: set[int], seconds: float) -> None:
        super().__init__(export_dir)
        self.calls, self.stall_on, self.seconds = 0, stall_on, seconds

    def infer(
        self,
        images: dict[str, np.ndarray],
        state: np.ndarray,
        instructions: list[str],
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        self.calls += 1
        if self.calls in self.stall_on:
            time.sleep(self.seconds)
        return super().infer(images, state, instructions, prefix, prefix_mask)


@pytest.mark.parametrize(("allowed", "passed"), [(1, False), (2, True)])
def test_gate_counts_deadline_misses_against_the_allowance(
    rp5: RobotSpec, export_dir: Path, allowed: int, passed: bool
) -> None:
    """Two of ten measured ticks overrun the 100 ms period (10 Hz): two misses, which fail a
    target that allows one and pass one that allows two; p99 is within its budget."""
    target = load_target("local-cpu").model_copy(update={"allowed_misses": allowed})
    assert target.control_hz is None and target.execute == 1  # the bundle's (rp5's) 10 Hz
    policy = StallingExport(export_dir, stall_on={2 + 3, 2 + 7}, seconds=0.15)  # after warm-up
    report = run_gate(
        export_dir,
        RecordingRobot(rp5),
        "touch the red cube",
        target,
        steps=10,
        warmup=2,
        budget_ms=10_000.0,
        pace=False,
        policy=policy,
    )
    assert report.misses == 2 and report.max_ms >= 150.0
    assert report.control_hz == 10.0 and report.deadline_ms == 100.0 and not report.rate_note
    assert report.passed is passed
    expected = [] if passed else ["2 deadline misses > 1 allowed"]
    assert report.reasons == expected


def test_the_export_runs_without_training_code(export_dir: Path) -> None:
    code = f"""
import sys, numpy as np
from deploy_edge.exported import ExportedPolicy
p = ExportedPolicy({str(export_dir)!r})
images = {{"scene": np.zeros((2, 32, 32, 3), np.uint8)}}
out = p.infer(images, np.zeros((2, 6), np.float32), ["touch the red cube"] * 2)
assert out.shape == (2, 3, 6), out.shape
loaded = [m for m in sys.modules if m.split(".")[0] in ("torch", "stages", "transformers", "peft")]
assert not loaded, loaded
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0 and "ok" in result.stdout, result.stderr


def test_bad_io_spec_and_target_are_refused(export_dir: Path, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(export_dir, broken)
    spec = json.loads((broken / "io_spec.json").read_text())
    spec["inputs"][1]["name"] = "proprio"
    (broken / "io_spec.json").write_text(json.dumps(spec))
    with pytest.raises(IOSpecError, match=r"declares inputs .*proprio.* but the model has"):
        ExportedPolicy(broken)
    (broken / "io_spec.json").unlink()
    with pytest.raises(IOSpecError, match="not an exported policy"):
        ExportedPolicy(broken)
    with pytest.raises(TargetError, match="unknown target 'jetson-nano-2014'"):
        load_target("jetson-nano-2014")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbudget_ms: -5\n")
    with pytest.raises(TargetError, match=r"bad\.yaml: field 'budget_ms' = -5"):
        load_target(str(bad))
