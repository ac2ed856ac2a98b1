"""Robot data from bags: ``robo-pipe import rosbag`` of a bag the twin recorded (MCAP, zstd),
the "as of" rule on random message timings, and bad input named before anything is written."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from robots.spec import RobotSpec
from sim_scenes.sim_robot import simulated
from sim_scenes.touch_task import TOUCH
from stages.dataset.reader import open_dataset
from stages.ingest.align import as_of
from stages.ingest.bag import Series
from stages.ingest.mapping import RosbagMapping
from stages.ingest.rosbag import episodes_of
from tests.stages.test_collect import LEROBOT_PYTHON

ROOT = Path(__file__).resolve().parents[2]
MAPPING = ROOT / "configs" / "ros2" / "rp5-twin-bag.yaml"
EPISODES, SEED = 3, 11


def robo_pipe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three expert episodes of touch-mixed, recorded by ``robo-pipe twin --expert``."""
    path = tmp_path_factory.mktemp("bags") / "expert"
    done = robo_pipe(
        "twin", "--expert", "--episodes", str(EPISODES), "--seed", str(SEED), "--record", str(path)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"recorded {path}: {EPISODES} episodes ({EPISODES} solved)" in done.stdout
    assert list(path.glob("*.mcap")), "an MCAP bag"
    return path


def test_a_bag_the_twin_recorded_imports_replays_to_success_and_lerobot_reads_it(
    bag: Path, tmp_path: Path, rp5: RobotSpec
) -> None:
    out = tmp_path / "ds"
    done = robo_pipe(
        "import", "rosbag", str(bag), "--mapping", str(MAPPING), "--out", str(out), "--json"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    ref = json.loads(done.stdout.strip().splitlines()[-1])
    assert ref["episodes"] == EPISODES and ref["robot"] == "rp5" and ref["fps"] == 10.0
    assert "dropped: none" in done.stderr and "/joint_states" in done.stderr
    dataset = open_dataset(out)
    frames = dataset.frames()
    report = dataset.provenance["import"]
    assert report["kept"] == report["frames"] == dataset.num_frames == ref["frames"]
    # Each episode's actions, replayed from its seed in the simulator, give back its states and
    # its success: the frames are aligned (no action one tick off) and the units are the arm's.
    episode = frames["episode_index"]
    for k in range(EPISODES):
        rows = np.flatnonzero(episode == k)
        arm = simulated(("scene",), 32, "touch-mixed", seed=SEED + k)
        arm.connect()
        assert dataset.tasks[int(frames["task_index"][rows[0]])] == arm.instruction
        for row in rows:
            np.testing.assert_allclose(
                arm.observe().state, frames["observation.state"][row], atol=1e-5
            )
            truth = frames["observation.environment_state"][row]  # the named object, as mocap
            np.testing.assert_allclose(arm.env_state(TOUCH), truth, atol=1e-6)
            if not arm.done:
                arm.act(frames["action"][row])
        assert arm.success, f"episode {k} replays to success"
        arm.stop()
    if LEROBOT_PYTHON:  # make test names it: LeRobot's own reader loads the dataset
        seen = subprocess.run(
            [LEROBOT_PYTHON, str(ROOT / "tests/stages/compat/lerobot_load.py"), str(out)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert seen.returncode == 0, seen.stderr[-3000:]
        loaded = json.loads(seen.stdout.strip().splitlines()[-1])
        assert loaded["num_frames"] == dataset.num_frames
        assert loaded["num_episodes"] == EPISODES and loaded["image_shape"] == [3, 64, 64]
        np.testing.assert_allclose(loaded["state"][0], frames["observation.state"][0], rtol=1e-6)


def _mapping(**changes: Any) -> RosbagMapping:
    data = yaml.safe_load(MAPPING.read_text())
    data.update(changes)
    return RosbagMapping.model_validate(data)


def test_no_feature_is_ever_sampled_from_after_its_frames_time(rp5: RobotSpec) -> None:
    """Random timings (jitter, gaps, rates of 30 Hz camera, 100 Hz joints, drops, stamps out
    of log order), through the importer's own frame builder: every value carries the time of
    the message it came from, and every frame's features come from at or before the frame's
    time, within max_age_s, and are the newest such message."""
    rng = np.random.default_rng(0)
    mapping = _mapping(
        every=3, max_age_s=0.02, episodes={"gap_s": 1.0}, task="touch", env_state=None
    )
    names = [j.name for j in (*rp5.arm, *rp5.gripper)]
    checked = 0
    for _ in range(40):
        t0 = 1_000_000_000_000
        cam = np.sort(t0 + np.cumsum(rng.uniform(30e6, 37e6, 300)).astype(np.int64))
        joints = np.sort(t0 + np.cumsum(rng.uniform(5e6, 15e6, 900)).astype(np.int64))
        joints = np.delete(joints, rng.choice(len(joints), 60, replace=False))  # lost messages
        cmd = np.sort(t0 + np.cumsum(rng.uniform(80e6, 120e6, 100)).astype(np.int64))
        # Each image says which message it is; each joint state and command says its time.
        image = [np.full((4, 4, 3), 0, np.uint8) for _ in cam]
        for k, img in enumerate(image):
            img[0, 0, :2] = (k // 256, k % 256)
        series = {
            "/scene_camera/image_raw": Series("/scene_camera/image_raw", cam, image),
            "/wrist_camera/image_raw": Series("/wrist_camera/image_raw", cam, image),
            "/joint_states": Series(
                "/joint_states", joints, [np.full(len(names), (t - t0) / 1e9) for t in joints]
            ),
            "/forward_position_controller/commands": Series(
                "/forward_position_controller/commands", cmd, [np.zeros(len(names)) for _ in cmd]
            ),
        }
        episodes, report = episodes_of(series, mapping, rp5, Path("bag"), Path("out"))
        assert report.kept == sum(e.length for e in episodes) and report.kept > 0
        for ep in episodes:
            for img, state in zip(ep.images["scene"], ep.state, strict=True):
                frame = cam[int(img[0, 0, 0]) * 256 + int(img[0, 0, 1])]
                # float32 keeps the time to a microsecond: the message is the nearest one
                decoded = t0 + float(state[0]) * 1e9
                source = int(joints[np.argmin(np.abs(joints - decoded))])
                assert source <= frame, "a joint state from after the frame"
                assert frame - source <= mapping.max_age_s * 1e9 + 1, "older than max_age_s"
                newer = joints[(joints > source) & (joints <= frame)]
                assert not len(newer), "not the newest joint state at the frame's time"
                checked += 1
    assert checked > 1000
    # The rule itself, on its own: before the first message there is none.
    found = as_of(np.array([5, 10, 20]), np.array([10, 15]), None)
    assert found.index.tolist() == [-1, 0, 1] and found.ok.tolist() == [False, True, True]


def _mcap(bag: Path) -> Path:
    return next(bag.glob("*.mcap"))


def test_bad_bags_and_mappings_are_named_before_anything_is_written(
    bag: Path, tmp_path: Path
) -> None:
    base = yaml.safe_load(MAPPING.read_text())
    joints = base["state"]["joints"]

    def mapping(**changes: Any) -> str:
        path = tmp_path / f"mapping-{len(list(tmp_path.glob('mapping-*')))}.yaml"
        path.write_text(yaml.safe_dump({**base, **changes}))
        return str(path)

    corrupt = tmp_path / "corrupt"
    shutil.copytree(bag, corrupt)
    data = bytearray(_mcap(corrupt).read_bytes())
    middle = len(data) // 2
    data[middle : middle + 4096] = bytes(4096)  # a zeroed block mid-file
    _mcap(corrupt).write_bytes(bytes(data))
    cases = {
        "a topic the bag lacks": (
            str(bag),
            mapping(cameras={"scene": "/top_camera/image_raw"}),
            "no topic /top_camera/image_raw (camera scene) in the bag",
        ),
        "a joint the robot lacks": (
            str(bag),
            mapping(state={"topic": "/joint_states", "joints": {"base_yaw": "j", "elbow": "k"}}),
            "field 'state.joints': elbow: robot rp5 has no such joint",
        ),
        "a joint the bag lacks": (
            str(bag),
            mapping(state={**base["state"], "joints": {**joints, "base_yaw": "j0"}}),
            "/joint_states has no joint j0",
        ),
        "images smaller than the dataset's": (
            str(bag), mapping(image_size=128), "images are 64x64, smaller than the dataset's 128 px"
        ),
        "a rate the robot does not run at": (
            str(bag), mapping(every=2), "frames at 5.0 Hz",
        ),
        "a corrupt bag": (str(corrupt), str(MAPPING), "corrupt"),
        "not a bag": (str(tmp_path), str(MAPPING), "cannot open the bag"),
    }  # fmt: skip
    for case, (source, mapped, named) in cases.items():
        out = tmp_path / "out"
        done = robo_pipe("import", "rosbag", source, "--mapping", mapped, "--out", str(out))
        assert done.returncode == 2, f"{case}: {done.stdout}{done.stderr[-2000:]}"
        assert named in done.stderr and "Traceback" not in done.stderr, f"{case}: {done.stderr}"
        assert not out.exists(), f"{case}: nothing is written"


def lerobot_spec(rp5: RobotSpec, **changes: Any) -> dict[str, Any]:
    """What ``compat/lerobot_record.py`` records: a dataset for rp5 as a lab would record its
    arm with LeRobot, with ``changes`` to what a matching one would be."""
    return {
        "fps": 10,
        "state_names": list(rp5.state_names),
        "action_names": list(rp5.action.names),
        "cameras": {"scene": [32, 32]},
        "home": [*rp5.authored.home_arm, rp5.authored.home_gripper],
        "state_scale": 1.0,
        "episodes": 2,
        "frames": 12,
        **changes,
    }


def record_with_lerobot(datasets: dict[Path, dict[str, Any]]) -> None:
    """Each dataset recorded by LeRobot's own recorder API, in its environment (one process)."""
    assert LEROBOT_PYTHON, "make test names LeRobot's environment"
    args = [str(a) for out, spec in datasets.items() for a in (out, json.dumps(spec))]
    recorded = subprocess.run(
        [LEROBOT_PYTHON, str(ROOT / "tests/stages/compat/lerobot_record.py"), *args],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr[-3000:]


@pytest.mark.skipif(not LEROBOT_PYTHON, reason="LeRobot's environment: `make lerobot-env`")
def test_a_dataset_lerobot_recorded_is_registered_or_its_mismatches_named(
    tmp_path: Path, rp5: RobotSpec, robo_pipe_home: Path
) -> None:
    from pipelines.steps.checks import check_dataset

    good, bad = tmp_path / "lab-arm", tmp_path / "other-arm"
    # The second: degrees instead of radians, 30 Hz, another arm's names, a non-square camera.
    mismatched = lerobot_spec(
        rp5, fps=30, state_scale=57.3, cameras={"scene": [24, 32]},
        action_names=["shoulder_pan.pos", *rp5.action.names[1:]],
    )  # fmt: skip
    record_with_lerobot({good: lerobot_spec(rp5), bad: mismatched})
    before = sorted((p.relative_to(good), p.stat().st_mtime_ns) for p in good.rglob("*"))
    done = robo_pipe("import", "lerobot", str(good), "--robot", "rp5", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    ref = json.loads(done.stdout.strip().splitlines()[-1])
    assert ref["episodes"] == 2 and ref["frames"] == 24 and ref["robot"] == "rp5"
    registered = robo_pipe_home / "datasets" / "lab-arm"
    assert Path(ref["path"]) == registered
    check_dataset(registered)  # what `robo-pipe finetune --dataset` checks first
    after = sorted((p.relative_to(good), p.stat().st_mtime_ns) for p in good.rglob("*"))
    assert after == before, "the source is never changed"
    again = robo_pipe("import", "lerobot", str(good))
    assert again.returncode == 2 and "exists" in again.stderr, "never replaced"

    refused = robo_pipe("import", "lerobot", str(bad), "--robot", "rp5")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    for named in (
        "fps = 30: robot rp5 runs at 10 Hz",
        "features.action.names = ['shoulder_pan.pos'",
        "features.observation.images.scene.shape = [24, 32, 3]",
        "observation.state[1] (shoulder_pitch.pos) ranges",
        "recorded in other units?",
    ):
        assert named in refused.stderr, f"{named!r} not in {refused.stderr}"
    assert not (robo_pipe_home / "datasets" / "other-arm").exists(), "nothing is written"
