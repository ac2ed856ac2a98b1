"""The collect stage: real simulator + expert into a v3 dataset; resume, append, Ray, bad input."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipelines.config import CONFIG_DIR, ConfigError, load_config
from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedObservation, StepResult
from sim_scenes.episodes import play_episodes
from sim_scenes.expert import ScriptedExpert
from sim_scenes.touch import OBJECT_HALF_HEIGHT, SceneError, get_variant, sample_layout
from stages.collect import ShardResult, collect
from stages.collect.run import plan_shards
from stages.dataset.layout import DatasetError, DatasetRef, content_hash
from stages.dataset.reader import open_dataset
from stages.worker_pool import WorkersDiedError
from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
SIZES = ["collect.episodes=10", "scene.image_size=64"]
"""On the tiny profile: 10 episodes (two shards of 4 and a short one) at the demo's 64 px (the
LeRobot reader test reads 64 x 64 frames)."""


def run_collect(out: Path, *overrides: str) -> DatasetRef:
    cfg = load_config(TINY_CONFIG, [*SIZES, *overrides])
    return collect(cfg.robot, cfg.scene, cfg.sim, cfg.collect, cfg.seed, out)


def test_collected_dataset_matches_a_replay_in_the_simulator(tmp_path: Path) -> None:
    ref = run_collect(tmp_path / "ds")
    ds = open_dataset(tmp_path / "ds")
    assert ref.episodes == ds.num_episodes == 10
    assert ds.provenance["source_success_rate"] == 1.0
    assert ds.provenance["code_version"]
    seeds = ds.provenance["episode_seeds"]
    # Replay the first two episodes' seeds with the expert and record what the policy saw.
    cfg = load_config(TINY_CONFIG, SIZES)
    robot = get_robot(cfg.robot)
    states: list[np.ndarray] = []
    images: list[np.ndarray] = []
    with make_env(robot, cfg.scene, cfg.sim, num_envs=1, autoreset=False) as env:
        for seed in seeds[:2]:

            def keep(
                slot: list[int], obs: BatchedObservation, actions: np.ndarray, result: StepResult
            ) -> None:
                states.append(obs.state[0])
                images.append(obs.images["scene"][0])

            play_episodes(env, ScriptedExpert(robot), [seed], on_step=keep)
    frames = ds.frames()
    n = len(states)
    np.testing.assert_array_equal(frames["observation.state"][:n], np.stack(states))
    decoded = ds.camera_frames("scene")[:n]
    assert np.abs(decoded.astype(int) - np.stack(images)).max() <= 3
    assert frames["episode_index"][:n].max() == 1
    assert ds.compare_stats() == []
    # Ground truth for training signals: the named object's centre at each frame.
    variant = get_variant(cfg.scene.variant)
    first = np.flatnonzero(frames["frame_index"] == 0)
    for episode, row in enumerate(first):
        layout = sample_layout(variant, robot, seeds[episode])
        x, y = layout.objects[layout.target].xy
        np.testing.assert_allclose(
            frames["observation.environment_state"][row], [x, y, OBJECT_HALF_HEIGHT], atol=1e-4
        )


def test_same_seeds_same_hash_other_seed_other_hash(tmp_path: Path) -> None:
    a = run_collect(tmp_path / "a")
    b = run_collect(tmp_path / "b")
    c = run_collect(tmp_path / "c", "seed=1")
    assert a.content_hash == b.content_hash
    assert a.content_hash != c.content_hash


def test_ray_workers_produce_the_same_dataset(tmp_path: Path) -> None:
    local = run_collect(tmp_path / "local")
    distributed = run_collect(tmp_path / "ray", "collect.workers=2")
    assert distributed.content_hash == local.content_hash


def test_a_worker_dead_once_too_often_stops_the_collect_and_a_rerun_resumes(
    tmp_path: Path,
) -> None:
    """Ray restarts a worker ``collect.max_worker_restarts`` times; here none: the first death
    is a named error saying which worker, on which shard, and what raises the limit."""
    killed: list[int] = []

    def kill_once(result: ShardResult) -> None:
        if not killed:  # that worker has just been handed its next shard
            killed.append(result.pid)
            os.kill(result.pid, signal.SIGKILL)

    cfg = load_config(TINY_CONFIG, [*SIZES, "collect.workers=2"])
    no_restarts = cfg.collect.model_copy(update={"max_worker_restarts": 0})
    with pytest.raises(WorkersDiedError) as raised:
        out = tmp_path / "ds"
        collect(cfg.robot, cfg.scene, cfg.sim, no_restarts, cfg.seed, out, on_shard=kill_once)
    message = str(raised.value)
    assert re.search(r"collect worker [12] of 2 died 1 time, the last time on shard \d+-", message)
    assert "collect.max_worker_restarts = 0" in message
    resumed = run_collect(tmp_path / "ds", "collect.workers=2")
    assert resumed.episodes == 10
    assert resumed.content_hash == run_collect(tmp_path / "clean").content_hash


def test_appending_keeps_existing_episodes(tmp_path: Path) -> None:
    run_collect(tmp_path / "ds")
    first = open_dataset(tmp_path / "ds").frames()
    run_collect(tmp_path / "ds", "collect.episodes=14")
    grown = open_dataset(tmp_path / "ds")
    assert grown.num_episodes == 14
    n = len(first["action"])
    np.testing.assert_array_equal(grown.frames()["action"][:n], first["action"])


def test_killed_collection_resumes_to_the_same_dataset(tmp_path: Path) -> None:
    args = [
        sys.executable,
        "-m",
        "pipelines.cli",
        "collect",
        "--config",
        str(TINY_CONFIG),
        "--json",
    ]
    sets = [x for o in [*SIZES, "collect.episodes=24"] for x in ("--set", o)]
    env = {**os.environ, "ROBO_PIPE_HOME": str(tmp_path / "home")}
    interrupted = tmp_path / "interrupted"
    proc = subprocess.Popen(
        [*args, *sets, "--out", str(interrupted)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 120
    while time.time() < deadline:  # kill it once a few shards are committed, mid-collection
        shards = list((interrupted / ".staging").glob("shard-*[0-9]/shard.json"))
        if len(shards) >= 2 or proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    committed = len(list((interrupted / ".staging").glob("shard-*[0-9]/shard.json")))
    assert 0 < committed < 6, "the kill should land mid-collection"
    assert not (interrupted / "meta/info.json").exists()
    with pytest.raises(DatasetError, match="interrupted collection"):
        open_dataset(interrupted)

    def run_to_completion(out: Path) -> dict[str, object]:
        done = subprocess.run(
            [*args, *sets, "--out", str(out)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        record: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
        return record

    resumed_ref = run_to_completion(interrupted)
    clean_ref = run_to_completion(tmp_path / "clean")
    assert resumed_ref["episodes"] == clean_ref["episodes"] == 24
    assert resumed_ref["content_hash"] == clean_ref["content_hash"]


def test_an_output_dir_with_a_different_dataset_is_refused_untouched(tmp_path: Path) -> None:
    run_collect(tmp_path / "ds")
    before = content_hash(tmp_path / "ds")
    with pytest.raises(DatasetError, match=r"holds a different dataset \(root_seed: 0 vs 3"):
        run_collect(tmp_path / "ds", "seed=3")
    with pytest.raises(DatasetError, match=r"cannot append.*variant 'touch-mixed'.*'touch-cubes'"):
        run_collect(tmp_path / "ds", "scene.variant=touch-cubes")
    assert content_hash(tmp_path / "ds") == before


def test_a_directory_of_other_files_is_refused_untouched(tmp_path: Path) -> None:
    other = tmp_path / "photos"
    other.mkdir()
    (other / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(DatasetError, match="holds other files"):
        run_collect(other)
    assert [p.name for p in other.iterdir()] == ["cat.jpg"]


def test_heldout_variants_and_bad_counts_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SceneError, match="held out for evaluation"):
        run_collect(tmp_path / "ds", "scene.variant=touch-mixed-clutter")
    for bad in ("0", "-5"):
        with pytest.raises(ConfigError, match=rf"field 'collect.episodes' = {bad}"):
            load_config(CONFIG_DIR / "demo.yaml", [f"collect.episodes={bad}"])
    assert not (tmp_path / "ds").exists() or not any((tmp_path / "ds").glob("meta/*"))


def test_plan_reuses_committed_shards_and_fills_gaps() -> None:
    shards, new = plan_shards(10, 4, set())
    assert shards == [(0, 4), (4, 8), (8, 10)] and new == shards
    shards, new = plan_shards(10, 4, {(0, 4), (8, 10)})
    assert shards == [(0, 4), (4, 8), (8, 10)] and new == [(4, 8)]
    shards, new = plan_shards(14, 4, {(0, 4), (4, 8), (8, 10)})
    assert shards[-2:] == [(8, 10), (10, 14)] and new == [(10, 14)]


LEROBOT_PYTHON = os.environ.get("ROBO_PIPE_LEROBOT_PYTHON") or shutil.which("lerobot-python")


@pytest.mark.skipif(
    not LEROBOT_PYTHON,
    reason="LeRobot is not installed (it needs Python 3.12 and torchvision): run `make "
    "lerobot-compat`, or set ROBO_PIPE_LEROBOT_PYTHON to a Python that has lerobot",
)
def test_lerobot_reads_our_dataset(tmp_path: Path) -> None:
    run_collect(tmp_path / "ds")
    ours = open_dataset(tmp_path / "ds")
    result = subprocess.run(
        [
            str(LEROBOT_PYTHON),
            str(ROOT / "tests/stages/compat/lerobot_load.py"),
            str(tmp_path / "ds"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["num_frames"] == ours.num_frames
    assert seen["num_episodes"] == ours.num_episodes
    assert seen["camera_keys"] == ["observation.images.scene"]
    assert seen["image_shape"] == [3, 64, 64]
    frames = ours.frames()
    images = ours.camera_frames("scene")
    assert len({frames["episode_index"][i] for i in seen["index"]}) > 1, "across episodes"
    for k, idx in enumerate(seen["index"]):
        assert seen["frame_index"][k] == frames["frame_index"][idx]
        assert seen["timestamp"][k] == pytest.approx(frames["frame_index"][idx] / seen["fps"])
        # LeRobot seeks the video by timestamp: the frame it decoded is ours at idx (or one
        # that looks the same), not a neighbour
        decoded = np.asarray(seen["images"][k]).transpose(1, 2, 0) * 255.0
        episode = np.flatnonzero(frames["episode_index"] == frames["episode_index"][idx])
        diffs = {int(j): float(np.abs(decoded - images[j]).mean()) for j in episode}
        assert diffs[idx] < 2.0 and diffs[idx] <= min(diffs.values()) + 0.05, (idx, diffs)
        np.testing.assert_allclose(seen["state"][k], frames["observation.state"][idx], rtol=1e-6)
        np.testing.assert_allclose(seen["action"][k], frames["action"][idx], rtol=1e-6)
        assert seen["tasks"][k] == ours.tasks[frames["task_index"][idx]]


def test_action_noise_is_executed_but_the_sources_action_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``collect.action_noise`` (DART): a source that always holds (rp5's home command, zero
    joint deltas) is recorded as holding, every frame, while the arm it drove moved under the
    noise; without noise it stays where it started."""
    from stages.collect import sources

    class Hold(sources.DemonstrationSource):
        name = "scripted_expert"

        def __init__(self, robot: Any, task: Any) -> None:
            self.home = np.asarray(robot.action.home, np.float32)

        def __call__(self, env: Any, obs: BatchedObservation) -> np.ndarray:
            return np.tile(self.home, (env.num_envs, 1))

    monkeypatch.setitem(sources.SOURCES, "scripted_expert", Hold)
    keep = ["collect.workers=0", "collect.keep_failed=true", "collect.episodes=4"]
    still = open_dataset(run_collect(tmp_path / "still", *keep).path).frames()
    moved = open_dataset(run_collect(tmp_path / "moved", *keep, "collect.action_noise=0.3").path)
    noisy = moved.frames()
    home = np.asarray(get_robot("rp5").action.home, np.float32)
    for frames in (still, noisy):
        np.testing.assert_array_equal(frames["action"], np.tile(home, (len(frames["action"]), 1)))

    def travel(frames: dict[str, np.ndarray]) -> float:
        """Largest joint change over an episode, rad."""
        states, episodes = frames["observation.state"], frames["episode_index"]
        return max(float(np.ptp(states[episodes == e, :5], axis=0).max()) for e in set(episodes))

    assert travel(still) < 0.01 < 0.1 < travel(noisy)
