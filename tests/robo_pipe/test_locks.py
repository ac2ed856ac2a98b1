"""Output locks between processes: a waiter names the holder's run and pid and waits for it; a
holder killed with SIGKILL never blocks, and the next one says it takes over."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from robo_pipe.locks import Holder, lock_files, output_lock

ROOT = Path(__file__).resolve().parents[2]

# A separate process (flock excludes open files, so threads of this one would prove nothing):
# takes the lock as run "nightly", says so, holds it until told to let go, and notes that.
HOLDER = """
import sys, time
from pathlib import Path
from robo_pipe.locks import output_lock, set_run_label

out, signals = Path(sys.argv[1]), Path(sys.argv[2])
set_run_label("nightly")
with output_lock(out, "collect"):
    (signals / "holding").touch()
    while not (signals / "let-go").exists():
        time.sleep(0.02)
    (signals / "left").touch()
"""


def start_holder(out: Path, signals: Path) -> subprocess.Popen[bytes]:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), str(signals)], cwd=ROOT)
    deadline = time.monotonic() + 60
    while not (signals / "holding").exists():
        assert holder.poll() is None and time.monotonic() < deadline, "the holder never held"
        time.sleep(0.02)
    return holder


def lock_in_thread(out: Path, lines: list[str], got: list[Holder | None]) -> threading.Thread:
    """Take the lock from this process in a thread (the test can see it block), noting whether
    the holder had left when it got in."""

    def take() -> None:
        with output_lock(out, "collect", lines.append) as dead:
            got.append(dead)
            lines.append(f"inside; holder left: {(out.parent / 'left').exists()}")

    thread = threading.Thread(target=take, daemon=True)
    thread.start()
    return thread


def test_a_waiter_names_the_holders_run_and_pid_and_gets_in_after_it(tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    holder = start_holder(out, tmp_path)
    lines: list[str] = []
    got: list[Holder | None] = []
    waiter = lock_in_thread(out, lines, got)
    waiter.join(timeout=2.0)
    assert waiter.is_alive(), "the waiter must wait while the holder holds"
    assert lines == [f"waiting for run nightly (pid {holder.pid}) to finish collect of {out}"]

    (tmp_path / "let-go").touch()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    assert holder.wait(timeout=30) == 0
    assert lines[1:] == ["inside; holder left: True"], "no takeover: the holder let go cleanly"
    assert got == [None]
    assert not lock_files(out)[1].exists(), "a clean release leaves no owner behind"


def test_a_holder_killed_with_sigkill_never_blocks_and_is_taken_over(tmp_path: Path) -> None:
    out = tmp_path / "dataset"
    holder = start_holder(out, tmp_path)
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    lines: list[str] = []
    got: list[Holder | None] = []
    taker = lock_in_thread(out, lines, got)
    taker.join(timeout=10)
    assert not taker.is_alive(), "the dead holder's lock blocked"
    assert lines == [
        f"run nightly (pid {holder.pid}) died during collect: taking over {out} and resuming",
        "inside; holder left: False",
    ]
    assert got[0] is not None and (got[0].run, got[0].pid) == ("nightly", holder.pid)
    # The one that took over released cleanly: the next one takes nothing over.
    with output_lock(out, "collect", lines.append) as dead:
        assert dead is None
    assert len(lines) == 2
