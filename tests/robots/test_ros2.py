"""The ROS 2 robot against the digital twin over loopback: ``robo-pipe twin`` in its own process,
the driver (:mod:`robots.ros2.driver`) here, and a listener here recording every command the
driver sends, as the arm's position controller would receive it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from robots.spec import RobotSpec
from tests.conftest import needs_ros

ROOT = Path(__file__).resolve().parents[2]
TWIN_CONFIG = ROOT / "configs" / "ros2" / "rp5-twin.yaml"


def ros_config(folder: Path, **changes: Any) -> Path:
    """The twin's config with ``changes``, on a ROS domain of this process's own (tests on two
    xdist workers, or two checkouts, must not hear each other's arm)."""
    data = yaml.safe_load(TWIN_CONFIG.read_text())
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    data["domain_id"] = 1 + (worker % 2) * 100 + os.getpid() % 100  # make test's 2 workers: apart
    data.update(changes)
    path = folder / "ros2.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def twin_process(config: Path, *args: str) -> subprocess.Popen[str]:
    """``robo-pipe twin`` on ``config``, started as a user starts it."""
    return subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "twin", "--ros-config", str(config), *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_a_config_that_cannot_drive_the_arm_is_named_before_the_twin_starts(
    tmp_path: Path,
) -> None:
    cases: dict[str, tuple[dict[str, Any], str]] = {
        "a joint rp5 lacks": (
            {"joints": {"base_yaw": "j1", "elbow": "j2"}},
            "field 'joints': elbow: robot rp5 has no such joint",
        ),
        "an unmapped joint": (
            {"joints": {"base_yaw": "j1"}},
            "field 'joints': robot rp5's shoulder_pitch",
        ),
        "a camera rp5 lacks": (
            {"topics": {"cameras": {"top": "/top/image_raw"}}},
            "field 'topics.cameras': top: robot rp5 has no such camera",
        ),
        "ages the wrong way round": ({"max_age_s": 2.0, "lost_after_s": 1.0}, "lost_after_s"),
    }
    for case, (changes, named) in cases.items():
        done = subprocess.run(
            [sys.executable, "-m", "pipelines.cli", "twin", "--ros-config",
             str(ros_config(tmp_path, **changes))],
            cwd=ROOT, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 2, f"{case}: {done.stdout}{done.stderr}"
        assert named in done.stderr and "ros2.yaml" in done.stderr, f"{case}: {done.stderr}"
        assert "Traceback" not in done.stderr, case


class Commands:
    """Every position command on the arm's command topic, with when it arrived."""

    def __init__(self, config: Path) -> None:
        from robots.ros2.config import load_ros2_config
        from robots.ros2.node import RELIABLE, Bool, Float64MultiArray, SpinningNode

        settings, _ = load_ros2_config(config)
        self.received: list[tuple[float, np.ndarray]] = []
        self._lock = threading.Lock()
        self.ros = SpinningNode("test_listener", settings.domain_id)
        self.ros.on(Float64MultiArray, settings.topics.command, self._store)
        self.estop = self.ros.node.create_publisher(Bool, settings.topics.estop, RELIABLE)
        self._bool = Bool

    def _store(self, message: Any) -> None:
        with self._lock:
            self.received.append((time.monotonic(), np.array(message.data)))

    def since(self, t: float) -> list[np.ndarray]:
        with self._lock:
            return [data for at, data in self.received if at >= t]

    def wait(self, t: float, count: int = 1, timeout_s: float = 30.0) -> list[np.ndarray]:
        """At least ``count`` commands received since ``t`` (a busy machine delays them)."""
        deadline = time.monotonic() + timeout_s
        while len(got := self.since(t)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(got) >= count, f"{len(got)} commands since then, expected {count}"
        return got

    def press_estop(self) -> None:
        self.estop.publish(self._bool(data=True))


@pytest.fixture
def twin(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    config = ros_config(tmp_path)
    process = twin_process(config, "--task", "touch-mixed")
    yield config, process
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        process.wait(timeout=30)


def tick(robot: Any, action: np.ndarray) -> Any:
    """One control period: observe, act (the hold when the observation carries a fault, as
    the control loops do), sleep the rest of the period."""
    obs = robot.observe()
    robot.act(robot.spec.hold_action(obs.state) if obs.fault else action)
    time.sleep(1.0 / robot.spec.control_hz)
    return obs


@needs_ros
def test_the_driver_clips_stops_on_the_e_stop_and_holds_when_the_twin_is_lost(
    twin: tuple[Path, subprocess.Popen[str]], rp5: RobotSpec
) -> None:
    from robots.ros2.driver import ros2_robot
    from sim_scenes.sim_robot import simulated

    config, process = twin
    commands = Commands(config)
    robot = ros2_robot(("scene", "wrist"), 32, str(config), seed=4)
    try:
        robot.connect()  # waits for the twin's first messages and a new episode
        here = simulated(("scene",), 32, "touch-mixed", seed=4)
        here.connect()
        assert robot.instruction == here.instruction, "the twin plays the episode of seed 4"
        here.stop()
        obs = tick(robot, rp5.hold_action(robot.observe().state))
        assert obs.images["scene"].shape == (32, 32, 3), "resized to the policy's size"
        assert obs.state.shape == (rp5.state_dim,) and not obs.fault

        # Limits: a delta past the per-step bound moves the joint by the bound; a gripper
        # opening past the fingers' travel is clipped to their travel.
        sent_at = time.monotonic()
        measured = robot.observe().state
        huge = np.array([5.0, -5.0, 0.0, 0.0, 0.0, 1.0])
        robot.act(huge)
        first = commands.wait(sent_at)[0]
        step = rp5.authored.max_joint_delta
        assert first[0] == pytest.approx(measured[0] + step, abs=1e-5)
        assert first[1] == pytest.approx(measured[1] - step, abs=1e-5)
        assert first[5] == pytest.approx(rp5.gripper[0].high) and first[6] == pytest.approx(
            rp5.gripper[1].high
        )

        # The e-stop: the episode ends with the reason; only holds are sent from then on.
        commands.press_estop()
        deadline = time.monotonic() + 30
        while not robot.done and time.monotonic() < deadline:
            tick(robot, huge)
        assert robot.done and robot.success is False and "e-stop" in robot.reason
        held_at = time.monotonic()
        for _ in range(3):
            tick(robot, huge)
        held = commands.wait(held_at, 3)
        assert held and all(np.allclose(c, held[0]) for c in held), "holds, never moves"

        # A new episode clears the stop; one without a seed of its own plays the twin's next.
        robot.connect()
        assert not robot.done and not robot.reason
        assert robot.simulator_episode["seed"] == 4
        follower = ros2_robot(("scene",), 32, str(config))  # seed None: the twin's next
        seeds = []
        for _ in range(2):
            follower.connect()
            seeds.append(follower.simulator_episode["seed"])
        follower.stop()
        assert seeds[1] == seeds[0] + 1, seeds
        robot.connect()
        # Then the twin dies mid-episode: within max_age_s the driver sends only the last
        # measured position, and after lost_after_s the episode ends.
        for _ in range(5):
            last = tick(robot, np.array([0.02, 0.0, 0.0, 0.0, 0.0, 0.02]))
        process.kill()
        killed = time.monotonic()
        process.wait(timeout=10)
        fresh = last
        while not robot.done and time.monotonic() < killed + 30:
            # The driver's own rule, not the loop's: it is sent the policy's action even when
            # the observation is stale, and must hold anyway.
            last_obs = robot.observe()
            fresh = fresh if last_obs.fault else last_obs
            robot.act(np.array([0.02, 0.0, 0.0, 0.0, 0.0, 0.02]))
            time.sleep(1.0 / rp5.control_hz)
        ended_in = time.monotonic() - killed
        settings = robot.config
        assert robot.done and robot.success is False and "lost" in robot.reason, robot.reason
        # Within a tick or two of lost_after_s (the loop's pace, slower on a busy machine).
        assert settings.lost_after_s <= ended_in <= settings.lost_after_s + 3.0, ended_in
        assert last_obs.fault.startswith("stale"), last_obs.fault
        after = commands.wait(killed + settings.max_age_s + 0.15)  # the driver keeps holding
        assert all(np.allclose(c, after[-1]) for c in after), "holds, never moves"
        # The hold is the last fresh measurement itself: no delta added to it.
        assert after[-1][:5] == pytest.approx(fresh.state[:5], abs=1e-5), "where it last was"
    finally:
        robot.stop()
        commands.ros.close()
