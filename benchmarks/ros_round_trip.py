"""Real robots at both ends, on the twin: a policy trained only on rosbag data, then driven over
ROS 2 by an edge agent (issue 51's round trip). Every step is the command a lab would type:

1. ``robo-pipe twin --expert --record BAG``: expert episodes of touch-mixed recorded as a rosbag2
   (MCAP, zstd), the twin's ground truth (the named object's position) on ``/robo_pipe/target``;
2. ``robo-pipe import rosbag BAG --mapping configs/ros2/rp5-twin-bag.yaml``, once with the ground
   truth and once without it (a bag with no motion capture): fine-tuning's auxiliary target;
3. ``robo-pipe finetune --dataset`` on each (the demo's config: its pretrained base, LoRA BC);
4. ``robo-pipe evaluate`` of each on the demo's held-out suite (200 episodes);
5. the better one exported (``robo-pipe export``), registered, ``robo-pipe deploy``-ed onto an
   edge agent whose robot is the twin over ROS 2 (``robots.ros2.driver:ros2_robot``), then
   ``robo-pipe devices episode`` N times (the twin plays its next seed each time).

Run: ``python benchmarks/ros_round_trip.py [--quick]`` in a home of its own (``--home``, default
a temporary folder; the demo's base is pretrained there first, ~7 min on 2 cores); ``--quick``:
the tiny profile, 100 episodes, 5 on the agent (a smoke run, not a figure). The last line is
``key=value`` pairs.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "ros-round-trip-operate"


def cli(home: Path, *args: str, ok: tuple[int, ...] = (0,)) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "ROBO_PIPE_HOME": str(home), "ARM_TOKEN": TOKEN},
    )  # fmt: skip
    if done.returncode not in ok:
        raise SystemExit(
            f"robo-pipe {' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}"
        )
    return done


def record(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout.strip().splitlines()[-1])


def train_and_evaluate(
    home: Path, bag: Path, mapping: Path, name: str, sets: list[str]
) -> tuple[str, float, float]:
    """Import, fine-tune, evaluate: (checkpoint, success, minutes)."""
    start = time.monotonic()
    out = home / "datasets" / name
    cli(home, "import", "rosbag", str(bag), "--mapping", str(mapping), "--out", str(out))
    trained = record(cli(home, "finetune", *sets, "--dataset", str(out), "--json"))
    judged = record(cli(home, "evaluate", trained["path"], *sets, "--json", ok=(0, 1)))
    success = float(judged["success_rate"])
    return trained["path"], success, (time.monotonic() - start) / 60


def on_the_agent(home: Path, checkpoint: str, sets: list[str], episodes: int) -> tuple[int, int]:
    """Export, register, deploy onto an agent driving the twin over ROS 2, run ``episodes``:
    (successes, misses)."""
    os.environ["ROBO_PIPE_HOME"] = str(home)
    from pipelines import tracking
    from pipelines.registry.exports import register_export
    from pipelines.services.local_servers import free_port
    from pipelines.services.settings import configure

    export = home / "exports" / "round-trip"
    cli(home, "export", checkpoint, *sets, "--out", str(export))
    configure()
    run = tracking.TrackedRun.start("ros-round-trip", "register")
    version = register_export(export, "ros-round-trip", run, {})
    run.finish()
    cli(home, "keys", "generate", "--name", "release")
    port, folder = free_port(), home / "edge"
    folder.mkdir(exist_ok=True)
    device = {
        "name": "arm",
        "listen": f"127.0.0.1:{port}",
        "trusted_keys": [str(home / "keys" / "release.pub")],
        "tokens": {"operate": [hashlib.sha256(TOKEN.encode()).hexdigest()]},
        "state_dir": str(folder / "state"),
        "driver": "robots.ros2.driver:ros2_robot",
        "driver_args": {"config": str(ROOT / "configs" / "ros2" / "rp5-twin.yaml")},
        "gate_steps": 50,
        "gate_warmup": 5,
        "health_ticks": 10,
    }
    (folder / "device.yaml").write_text(yaml.safe_dump(device))
    entry = {"name": "arm", "url": f"http://127.0.0.1:{port}", "token_env": "ARM_TOKEN"}
    (folder / "devices.yaml").write_text(yaml.safe_dump({"devices": [entry]}))
    env = {**os.environ, "ROBO_PIPE_HOME": str(home)}
    py = [sys.executable, "-m", "pipelines.cli"]
    twin = subprocess.Popen([*py, "twin", "--seed", "700000"], cwd=ROOT, env=env)
    agent = subprocess.Popen(
        [*py, "edge-agent", "--device-config", str(folder / "device.yaml")], cwd=ROOT, env=env
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.2)
        devices = ("--device", "arm", "--devices", str(folder / "devices.yaml"))
        key = str(home / "keys" / "release.key")
        cli(home, "deploy", f"models:/ros-round-trip/{version.version}", *devices, "--key", key)
        results = [
            record(cli(home, "devices", "episode", "arm", "--devices", devices[-1],
                       "--ticks", "100", "--json", ok=(0, 1)))
            for _ in range(episodes)
        ]  # fmt: skip
    finally:
        agent.terminate()
        twin.terminate()
        agent.wait(timeout=30)
        twin.wait(timeout=30)
    return sum(bool(r["success"]) for r in results), sum(r["misses"] for r in results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the tiny profile: a smoke run")
    parser.add_argument("--home", type=Path, help="a home to keep (default: a temporary one)")
    parser.add_argument("--episodes", type=int, help="expert episodes (default 1000; quick 100)")
    args = parser.parse_args()
    sets = ["-c", "configs/tiny.yaml"] if args.quick else ["-c", "configs/demo.yaml"]
    episodes = args.episodes or (100 if args.quick else 1000)
    on_agent = 5 if args.quick else 30
    with tempfile.TemporaryDirectory(prefix="ros-round-trip-") as tmp:
        home = args.home or Path(tmp) / "home"
        bag = home / "bags" / "expert"
        if not bag.exists():
            cli(home, "twin", "--expert", "--episodes", str(episodes), "--seed", "500000",
                "--record", str(bag))  # fmt: skip
        shipped = yaml.safe_load((ROOT / "configs" / "ros2" / "rp5-twin-bag.yaml").read_text())
        size = {"image_size": 32} if args.quick else {}  # the tiny profile's images
        mapping, blind = home / "mapping.yaml", home / "no-ground-truth.yaml"
        mapping.write_text(yaml.safe_dump({**shipped, **size}))
        blind.write_text(yaml.safe_dump({**shipped, **size, "env_state": None}))
        ckpt, success, minutes = train_and_evaluate(home, bag, mapping, "with-truth", sets)
        print(f"trained on the bag, with ground truth: {success:.1%} held-out ({minutes:.1f} min)")
        _, blind_success, _ = train_and_evaluate(home, bag, blind, "without-truth", sets)
        print(f"trained on the bag, without ground truth: {blind_success:.1%} held-out")
        solved, misses = on_the_agent(home, ckpt, sets, on_agent)
        print(f"on the agent over ROS 2: {solved}/{on_agent} episodes succeeded, {misses} misses")
        print(
            f"expert_episodes={episodes} held_out_success={success:.3f} "
            f"held_out_success_without_ground_truth={blind_success:.3f} "
            f"ros_episodes={on_agent} ros_successes={solved} ros_misses={misses}"
        )


if __name__ == "__main__":
    main()
