"""The child processes the verbs start: a process named by its pid and start time (a reused
pid is another process), a process group signalled as one, and the parent-death signal that
stops a server when the verb that started it dies."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def process_start(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot, ``/proc/<pid>/stat`` field 22):
    with the pid, it names one process even after the pid is reused. None if there is none."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    if fields[0] == "Z":  # a zombie: it has ended, only its exit status is left
        return None
    return int(fields[19])


def same_process(pid: int, start: object) -> bool:
    """``pid`` is alive and is the process that started at ``start`` (no start recorded: any
    process with that pid)."""
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def command_line(pid: int | str) -> str:
    """The command line of process ``pid``, its arguments joined by spaces ("" if it is gone)."""
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to process group ``pgid``; False if no process of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


_PDEATHSIG_SHIM = (
    "import ctypes,os,signal,sys;"
    "ctypes.CDLL(None,use_errno=True).prctl(1,signal.SIGTERM,0,0,0);"  # PR_SET_PDEATHSIG
    "os.getppid()==int(sys.argv[1]) or sys.exit(0);"  # its parent died already: do not start
    "os.execvp(sys.argv[2],sys.argv[2:])"
)
"""``python -c SHIM PARENT_PID CMD...``: runs CMD in this process, which the kernel sends
SIGTERM when the thread that started it exits (the parent-death signal survives ``exec``), so
a server stops when its verb dies, however it dies (SIGKILL included)."""

PDEATHSIG = os.environ.get("ROBO_PIPE_NO_PDEATHSIG") is None
"""Whether servers get the parent-death signal (tests turn it off to make a survivor)."""


def with_parent_death(cmd: list[str]) -> list[str]:
    """``cmd`` run through the parent-death shim (Linux, unless tests turned it off)."""
    if not PDEATHSIG or not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-c", _PDEATHSIG_SHIM, str(os.getpid()), *cmd]
