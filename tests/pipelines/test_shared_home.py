"""Runs sharing one $ROBO_PIPE_HOME, through the CLI: two collects of the same config take turns
(the second waits, says for whom, and reuses the dataset the first wrote), and a collect killed
with SIGKILL is taken over and resumed by the next one."""

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

from pipelines.config import load_config
from robo_pipe.locks import lock_files, output_lock
from tests.conftest import TINY_CONFIG

ROOT = Path(__file__).resolve().parents[2]
SLOWER = ["collect.envs_per_worker=2"]
"""On the tiny profile, 2 episodes at a time (not 4): the timing these tests rely on (a lock
held long enough to be seen, a kill that lands mid-collection) was measured with it."""


EPISODES = 24  # the two collects' dataset size (see the first test)


def start_collect(home: Path, episodes: int, log: Path) -> subprocess.Popen[bytes]:
    """``robo-pipe collect --config configs/tiny.yaml --json`` on ``home``; stdout and stderr to
    ``log``.out and ``log``.err."""
    sets = [x for o in [*SLOWER, f"collect.episodes={episodes}"] for x in ("--set", o)]
    with log.with_suffix(".out").open("wb") as out, log.with_suffix(".err").open("wb") as err:
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipelines.cli",
                "collect",
                "--config",
                str(TINY_CONFIG),
                *sets,
                "--json",
            ],
            cwd=ROOT,
            env={**os.environ, "ROBO_PIPE_HOME": str(home), "COLUMNS": "200"},
            stdout=out,
            stderr=err,
        )


def dataset_dir(home: Path, episodes: int) -> Path:
    """Where the collects above write (the CLI's default: the config's dataset)."""
    cfg = load_config(TINY_CONFIG, [*SLOWER, f"collect.episodes={episodes}"])
    return home / "datasets" / cfg.dataset_name()


def wait_until(condition: Callable[[], bool], what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


def test_two_collects_of_one_config_take_turns_and_write_the_dataset_once(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    # 24 episodes hold the lock for about a second: the waiter reads the holder every POLL_S,
    # and a collect of 8 (0.3 s on a quiet machine) could finish between two of its reads, so
    # the waiter would never see (or name) the run it waited for.
    dataset = dataset_dir(robo_pipe_home, EPISODES)
    info = dataset / "meta/info.json"
    logs = [tmp_path / "first", tmp_path / "second"]
    # This test holds the dataset's lock until both have started and wait at it, so they race
    # for it from the same line (not from their start-up, which takes longer than collecting).
    with output_lock(dataset, "collect"):
        procs = [start_collect(robo_pipe_home, EPISODES, log) for log in logs]
        wait_until(
            lambda: all("waiting for" in log.with_suffix(".err").read_text() for log in logs),
            "both collects wait",
        )
    written: set[tuple[int, int]] = set()  # every version of info.json seen while they run
    while any(p.poll() is None for p in procs):
        if info.is_file():
            stat = info.stat()
            written.add((stat.st_ino, stat.st_mtime_ns))
        time.sleep(0.01)
    outs = [log.with_suffix(".out").read_text() for log in logs]
    errs = [log.with_suffix(".err").read_text() for log in logs]
    assert [p.returncode for p in procs] == [0, 0], errs
    refs = [json.loads(out.strip().splitlines()[-1]) for out in outs]
    assert refs[0]["content_hash"] == refs[1]["content_hash"] and refs[0]["episodes"] == EPISODES

    reused = [i for i, err in enumerate(errs) if "collect: reusing the dataset" in err]
    assert len(reused) == 1, errs
    waiter, first = reused[0], 1 - reused[0]
    # "waiting for run <the first's run folder> (pid <its pid>) to finish collect of <dataset>"
    waits = re.findall(
        rf"waiting for run (\S+) \(pid (\d+)\) to finish collect of {re.escape(str(dataset))}",
        errs[waiter],
    )
    assert waits and waits[-1][1] == str(procs[first].pid), errs
    assert (robo_pipe_home / "runs" / waits[-1][0]).is_dir(), "the label names its run folder"
    assert len(written) == 1 and (info.stat().st_ino, info.stat().st_mtime_ns) in written, (
        "the dataset was finalized once, by the run that collected it"
    )
    assert not lock_files(dataset)[1].exists()


def test_a_collect_killed_mid_way_is_taken_over_and_resumed(
    robo_pipe_home: Path, tmp_path: Path
) -> None:
    dataset = dataset_dir(robo_pipe_home, 16)
    killed = start_collect(robo_pipe_home, 16, tmp_path / "killed")
    shards = dataset / ".staging"
    wait_until(lambda: any(shards.glob("shard-*[0-9]/shard.json")), "a shard is committed")
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    before = {p.parent.name: p.stat() for p in shards.glob("shard-*[0-9]/shard.json")}
    assert 0 < len(before) < 4, "the kill should land mid-collection"
    (label,) = [p.name for p in (robo_pipe_home / "runs").iterdir()]

    resumed = start_collect(robo_pipe_home, 16, tmp_path / "resumed")
    assert resumed.wait(timeout=300) == 0, (tmp_path / "resumed.err").read_text()
    err = (tmp_path / "resumed.err").read_text()
    assert (
        f"collect: run {label} (pid {killed.pid}) died during collect: taking over {dataset} "
        "and resuming"
    ) in err
    assert (
        f"collect: {len(before)} of 4 shards already committed; collecting the other "
        f"{4 - len(before)}"
    ) in err
    ref = json.loads((tmp_path / "resumed.out").read_text().strip().splitlines()[-1])
    assert ref["episodes"] == 16
    for name, stat in before.items():  # committed before the kill: kept, not collected again
        now = (shards / name / "shard.json").stat()
        assert (now.st_ino, now.st_mtime_ns) == (stat.st_ino, stat.st_mtime_ns), name
