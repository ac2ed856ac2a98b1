"""The progress lines: a BC checkpoint shows its loss, an RL one its training success (never a
loss it does not have), and progress reaches every listener of the process."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from pipelines.cli.display import LiveRows, StageLog
from pipelines.progress import describe, listening, rl_detail


def test_a_checkpoint_is_described_by_what_trained_it() -> None:
    bc = SimpleNamespace(step=600, metrics={"action_loss": 0.0123, "samples_per_s": 850.0})
    rl = SimpleNamespace(step=12, metrics={"env_steps": 9600.0, "success_rate": 0.75})
    assert describe("finetune", bc) == "step 600, loss 0.0123"
    assert describe("finetune", rl) == "iteration 12, training success 75%"
    no_episodes_yet = SimpleNamespace(step=1, metrics={"env_steps": 800.0})
    assert describe("finetune", no_episodes_yet) == "iteration 1, training success -"
    assert rl_detail("sac", {"step": 3, "env_steps_per_s": 1234.5}) == (
        "sac iteration 3: training success -, 1,234 env-steps/s"
    )


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def started(self, stage: str, total: float | None, unit: str) -> None:
        self.events.append(("started", stage, unit))

    def advanced(self, stage: str, completed: float, detail: str) -> None:
        self.events.append(("advanced", stage, detail))

    def finished(self, stage: str, detail: str, reused: bool) -> None:
        self.events.append(("finished", stage, detail))

    def said(self, stage: str, line: str) -> None:
        self.events.append(("said", stage, line))


def test_progress_reaches_the_listeners_of_the_block_only() -> None:
    from pipelines.progress import BROADCAST

    recorder = Recorder()
    with listening(recorder):
        BROADCAST.started("collect", 10, "episodes")
        BROADCAST.finished("collect", "10 episodes", False)
    BROADCAST.advanced("collect", 5, "after the block")
    assert recorder.events == [
        ("started", "collect", "episodes"),
        ("finished", "collect", "10 episodes"),
    ]


# -- what a verb shows: plain lines in a log, live rows in a terminal ---------------------------


class Clock:
    """A clock the test moves (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def plain_log(every_s: float = 30.0) -> tuple[StageLog, Clock]:
    """A log display on a console as rich makes one for a log file: 80 columns."""
    clock = Clock()
    return StageLog(Console(file=io.StringIO(), width=80), every_s, clock), clock


def printed(log: StageLog) -> list[str]:
    file = log.out.file
    assert isinstance(file, io.StringIO)
    return file.getvalue().splitlines()


def test_a_log_gets_one_line_per_stage_as_it_ends() -> None:
    """Through the process's listeners, as the flow's tasks report: nothing while a stage runs
    (before its interval), then its one line: ok and its duration, or reused."""
    from pipelines.progress import BROADCAST

    log, clock = plain_log()
    with listening(log):
        BROADCAST.finished("pretrain", "step 600, loss 0.0123", True)  # reused: never started
        BROADCAST.started("collect", 2000, "episodes")
        clock.now = 20.0
        BROADCAST.advanced("collect", 1000, "source success 98%, 1,234 frames/s")
        log.tick()
        clock.now = 29.5
        BROADCAST.finished("collect", "2000 episodes, 120000 frames", False)
        log.tick()
    assert printed(log) == [
        "pretrain: reused (an earlier run's): step 600, loss 0.0123",
        "collect: ok in 29.5 s: 2000 episodes, 120000 frames",
    ]


def test_a_long_stage_prints_a_progress_line_each_interval() -> None:
    log, clock = plain_log(every_s=30.0)
    log.started("finetune", 600, "BC steps")
    log.started("export", None, "")  # reports nothing until it ends
    clock.now = 29.0
    log.advanced("finetune", 270, "loss 0.0123, 850 samples/s")
    log.tick()
    assert printed(log) == [], "not before the interval"
    clock.now = 30.0
    log.tick()
    clock.now = 59.0
    log.tick()
    clock.now = 61.0
    log.finished("export", "parity 1.2e-06", False)
    log.tick()  # nothing new from finetune: the line says it still runs
    # Time left: the time so far times what is left over what is done (30 x 330 / 270 s).
    assert printed(log) == [
        "finetune: 45% (270 of 600 BC steps), 0:00:30 elapsed, ~0:00:37 left: loss 0.0123, "
        "850 samples/s",
        "export: running, 0:00:30 elapsed",
        "export: ok in 61.0 s: parity 1.2e-06",
        "finetune: 45% (270 of 600 BC steps), 0:01:01 elapsed, ~0:01:15 left: loss 0.0123, "
        "850 samples/s",
    ]


def test_pretraining_estimates_its_demonstrations_then_its_steps_each_at_its_own_pace() -> None:
    """The demo's pretraining collects 3,000 demonstrations (minutes) before its first step:
    its line counts them, with the time left, then its steps, estimated from the steps' own
    pace (not the collection's); the elapsed time is the stage's."""
    log, clock = plain_log(every_s=30.0)
    log.started("pretrain", 3000, "demonstrations")
    clock.now = 30.0
    log.advanced("pretrain", 500, "collecting the base's demonstrations")
    log.tick()
    clock.now = 180.0
    log.started("pretrain", 3000, "steps")  # the demonstrations are all in
    clock.now = 210.0
    log.advanced("pretrain", 300, "loss 0.1234, 600 samples/s")
    log.tick()
    assert printed(log) == [
        "pretrain: 17% (500 of 3,000 demonstrations), 0:00:30 elapsed, ~0:02:30 left: "
        "collecting the base's demonstrations",
        "pretrain: 10% (300 of 3,000 steps), 0:03:30 elapsed, ~0:04:30 left: loss 0.1234, "
        "600 samples/s",
    ]

    # The live rows in a terminal estimate too (rich's pace of the row), and only while it runs.
    clock = Clock()
    rows = LiveRows(Console(file=io.StringIO(), width=200, force_terminal=True), clock=clock)
    rows.started("pretrain", 3000, "steps")
    for now, step in ((10.0, 100), (20.0, 200), (30.0, 300)):
        clock.now = now
        rows.advanced("pretrain", step, "loss 0.1234")
    rows.started("export", None, "")
    screen = io.StringIO()
    Console(file=screen, width=200).print(rows.progress.get_renderable())
    shown = {line.split()[0]: line for line in screen.getvalue().splitlines()}
    assert "~0:04:30 left" in shown["pretrain"], shown
    assert "left" not in shown["export"], "no estimate without a total"


def test_the_log_ticks_by_itself() -> None:
    """In a thread: a stage that reports nothing still gets its lines (here every 20 ms)."""
    log = StageLog(Console(file=io.StringIO(), width=80), every_s=0.02)
    with log.ticking():
        log.started("latency", None, "")
        time.sleep(0.3)
    assert any(line.startswith("latency: running, 0:00:00 elapsed") for line in printed(log))


def test_a_long_path_in_a_log_line_stays_whole() -> None:
    """rich wraps a log file's lines at 80 columns; a path must stay on one line."""
    path = "/tmp/pytest-of-ci/" + "/".join(["run-20261126-abcdef0123456789"] * 4) + "/ds"
    path += "x" * (150 - len(path))
    assert len(path) == 150
    log, _ = plain_log()
    log.said("collect", f"waiting for run r1 (pid 42) to finish collect of {path}")
    log.finished("export", f"exported to {path}", False)
    lines = printed(log)
    assert len(lines) == 2 and all(path in line for line in lines), lines


def test_device_steps_show_their_own_duration_and_no_made_up_one() -> None:
    """The local agent's deploy: its steps are reported only as they end, their status carrying
    the device's own duration; the display adds none (it used to show 0:00:00 beside
    "ok (33.5 s)"), while the deploy stage and the upload are timed from their start."""
    log, clock = plain_log()
    log.started("deploy", None, "to local-agent")
    log.started("upload", 12_300_000, "bytes")
    clock.now = 0.5
    log.finished("upload", "12.3 MB", False)
    clock.now = 34.0
    log.finished("verify", "ok (33.5 s)", False)
    log.finished("gate", "FAILED: p99 4.10 ms over budget 2 ms (2.0 s)", False)
    clock.now = 40.0
    log.finished("deploy", "local-agent: v1 refused", False)
    assert printed(log) == [
        "upload: ok in 0.5 s: 12.3 MB",
        "verify: ok (33.5 s)",
        "gate: FAILED: p99 4.10 ms over budget 2 ms (2.0 s)",
        "deploy: ok in 40.0 s: local-agent: v1 refused",
    ]

    # The live rows in a terminal: the same, as rows.
    clock = Clock()
    rows = LiveRows(Console(file=io.StringIO(), width=200, force_terminal=True), clock=clock)
    rows.started("deploy", None, "to local-agent")
    clock.now = 34.0
    rows.finished("verify", "ok (33.5 s)", False)
    rows.finished("collect", "2000 episodes, 120000 frames", True)
    screen = io.StringIO()
    Console(file=screen, width=200).print(rows.progress.get_renderable())
    shown = {line.split()[0]: line for line in screen.getvalue().splitlines()}
    elapsed = re.compile(r"\d+:\d\d:\d\d")
    assert "ok (33.5 s)" in shown["verify"] and not elapsed.search(shown["verify"])
    assert not elapsed.search(shown["collect"]), "a reused stage took no time of this run's"
    assert "0:00:34" in shown["deploy"]


def test_a_path_in_an_error_is_one_line_in_a_log(tmp_path: Path) -> None:
    """Through the CLI, stderr piped and no COLUMNS (as in `make demo > log`): the console
    does not wrap at 80 columns, so the path named in the error stays whole."""
    path = tmp_path / ("a" * 60) / ("b" * 60) / "missing.yaml"
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "run", "--config", str(path)],
        env={**env, "ROBO_PIPE_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert any(str(path) in line for line in result.stderr.splitlines()), result.stderr


def test_rl_under_a_time_budget_counts_its_seconds_not_its_iteration_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """rl-demo's PPO runs 12 minutes under a cap of 100,000 iterations: its line counts the
    budget's seconds (so the time left is the budget's), and names the iteration it is at;
    without a budget it counts iterations."""
    import stages.finetune
    from pipelines.config import load_config
    from pipelines.steps.training import rl_finetune_from
    from tests.conftest import TINY_CONFIG

    reports: list[dict[str, float]] = [
        {"step": 1, "env_steps_per_s": 100.0, "success_rate": 0.5},
        {"step": 2, "env_steps_per_s": 120.0},
    ]

    def rl_finetune(
        *args: object, on_metrics: Callable[[dict[str, float]], None], **kw: object
    ) -> str:
        for metrics in reports:
            on_metrics(metrics)
        return "checkpoint"

    monkeypatch.setattr(stages.finetune, "rl_finetune", rl_finetune)
    calls: list[tuple[str, float, str]] = []

    class Counting(Recorder):
        def started(self, stage: str, total: float | None, unit: str) -> None:
            calls.append(("started", total or 0.0, unit))

        def advanced(self, stage: str, completed: float, detail: str) -> None:
            calls.append(("advanced", completed, detail))

    for budget, total, unit in (
        (720.0, 720.0, "s of ppo's time budget"),
        (None, 2, "ppo iterations"),
    ):
        cfg = load_config(
            TINY_CONFIG, ["finetune.algo=ppo", f"finetune.rl.time_budget_s={json.dumps(budget)}"]
        )
        calls.clear()
        rl_finetune_from(cfg, "start", Counting())  # type: ignore[arg-type]
        assert calls[0] == ("started", total, unit)
        done = [c[1] for c in calls[1:]]
        if budget is None:
            assert done == [1, 2]
        else:  # seconds since it started, within the budget
            assert all(0 <= d < 60 for d in done) and done == sorted(done)
        assert calls[1][2] == "ppo iteration 1: training success 50%, 100 env-steps/s"
