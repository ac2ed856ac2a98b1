"""A worker killed with ``kill -9`` mid-stage, through the CLI: Ray restarts it, its shard is
done again, and the stage ends with the requested counts and the result of an undisturbed run
(issue 25 points 1 and 7). The worker is found as the out-of-memory killer would pick it: a
process of the stage's own (a descendant of the CLI process) titled ``ray::<Worker>.<method>``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
TINY = str(TINY_CONFIG)
COLLECT = ["collect.episodes=24"]
"""On the tiny profile: 6 shards of 4 episodes for the stage's 2 workers."""
EVALUATE = [
    "evaluate.variants=[touch-mixed-clutter]",
    "evaluate.envs_per_worker=2",
    "evaluate.episodes_per_shard=2",
]
"""On the tiny profile: its 4 episodes on one variant, in 2 shards for the stage's 2 workers."""


def cli(args: list[str], sets: list[str]) -> list[str]:
    """The command line of ``robo-pipe ARGS --set S...`` with a JSON record."""
    flags = [arg for s in sets for arg in ("--set", s)]
    return [sys.executable, "-m", "pipelines.cli", *args, *flags, "--json"]


def run(args: list[str], sets: list[str], home: Path) -> dict[str, object]:
    """Run the CLI to the end; its JSON record."""
    env = {**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"}
    done = subprocess.run(
        cli(args, sets), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    record: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return record


def descendant(root: int, title: str) -> int | None:
    """A process under ``root`` whose title starts with ``title`` (Ray titles an actor's process
    ``ray::Class.method`` while it runs that method)."""
    table = subprocess.run(
        ["ps", "-eo", "pid=,ppid=,args="], capture_output=True, text=True, check=True
    ).stdout
    parent: dict[int, int] = {}
    titles: dict[int, str] = {}
    for line in table.splitlines():
        pid, ppid, args = [*line.split(None, 2), ""][:3]
        parent[int(pid)], titles[int(pid)] = int(ppid), args
    for process, args in titles.items():
        ancestor = process
        while ancestor > 1 and ancestor != root:
            ancestor = parent.get(ancestor, 1)
        if ancestor == root and args.startswith(title):
            return process
    return None


def run_killing(
    args: list[str], sets: list[str], home: Path, title: str, ready: Callable[[], bool]
) -> tuple[dict[str, object], str, int]:
    """Run the CLI and ``kill -9`` its first worker titled ``title`` once ``ready()``; the JSON
    record, stderr and the killed pid."""
    env = {**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"}
    proc = subprocess.Popen(
        cli(args, sets),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    killed = None
    deadline = time.time() + 240
    while killed is None and proc.poll() is None and time.time() < deadline:
        if ready():
            killed = descendant(proc.pid, title)
            if killed is not None:
                os.kill(killed, signal.SIGKILL)
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=300)
    assert killed is not None, f"no {title} process was seen to kill:\n{stderr}"
    assert proc.returncode == 0, stderr
    return json.loads(stdout.strip().splitlines()[-1]), stderr, killed


def test_a_collect_worker_killed_mid_collect_is_restarted_and_its_shard_redone(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    killed_run = tmp_path / "killed"
    staged = killed_run / ".staging"

    def a_shard_committed() -> bool:
        return any(staged.glob("shard-*[0-9]/shard.json"))

    ref, stderr, pid = run_killing(
        ["collect", "--config", TINY, "--out", str(killed_run)],
        [*COLLECT, "collect.workers=2"],
        robo_pipe_home,
        "ray::CollectWorker.collect_shard",
        a_shard_committed,
    )
    undisturbed = run(
        ["collect", "--config", TINY, "--out", str(tmp_path / "undisturbed")],
        [*COLLECT, "collect.workers=0"],
        robo_pipe_home,
    )
    assert ref["episodes"] == 24
    assert ref["content_hash"] == undisturbed["content_hash"], "the same episodes, byte for byte"
    line = re.search(
        rf"collect worker [12] of 2 \(pid {pid}\) died; restarted as pid \d+, which redid "
        r"shard (\d+)-(\d+)",
        stderr,
    )
    assert line, stderr
    assert int(line[2]) - int(line[1]) == 4


def test_an_evaluate_worker_killed_mid_shard_is_restarted_and_its_episodes_redone(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    import torch

    from stages.policy.checkpoint import new_policy, save_policy
    from tests.stages.tiny_models import TINY_POLICY

    torch.manual_seed(1)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    save_policy(policy, tmp_path / "ckpt", None)
    args = ["evaluate", str(tmp_path / "ckpt"), "--config", TINY]

    report, stderr, pid = run_killing(
        args,
        [*EVALUATE, "evaluate.workers=2"],
        robo_pipe_home,
        "ray::EvalWorker.run",  # past its warm-up, playing a shard
        lambda: True,
    )
    undisturbed = run(args, [*EVALUATE, "evaluate.workers=0"], robo_pipe_home)
    assert report["episodes"] == 4 and report["replacements"] == 1
    assert report["outcomes"] == undisturbed["outcomes"], "the same episodes, the same outcomes"
    line = rf"evaluate worker [12] of 2 \(pid {pid}\) died; restarted as pid \d+, which redid "
    assert re.search(line, stderr), stderr
