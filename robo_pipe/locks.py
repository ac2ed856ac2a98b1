"""Inter-process locks on outputs: one writer at a time, and waiters told whom they wait for.

Several processes share a robo-pipe home: a scheduled retrain of ``robo-pipe serve`` beside a
``robo-pipe run`` in a terminal, two teammates starting the same config. Every output that more
than one of them may write (a dataset, a checkpoint directory, an export, the local edge agent's
state) is produced inside :func:`output_lock`, and the stage checks its own cache again inside
the lock, so a run that waited reuses what the first one produced::

    with output_lock(out, "collect", on_status):
        ... reuse ``out`` if it is complete, else produce (or resume) it ...

The lock is an ``flock`` (through ``filelock``) on ``<parent>/.<name>.lock``. The kernel drops
it when its holder dies, so a stale lock of a dead process never blocks. The holder's identity
(run label, pid, host, stage, since) is kept beside it in ``<parent>/.<name>.owner.json``:
written after acquiring, removed before a clean release. A waiter reads it to say whom it waits
for; an owner file still there after acquiring means its holder died without releasing, and the
new holder says it takes over and resumes from what the dead one left.

The lock is not reentrant across :func:`output_lock` calls: nesting two on the same path in one
process waits forever (the stages nest only different paths: a base, then its datasets).
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path

from filelock import FileLock, Timeout

StatusFn = Callable[[str], None]
"""Receives one line for people: whom this process waits for, or whose output it takes over."""

POLL_S = 0.1
"""How often a waiting process tries the lock again and reads who holds it (between tries
Ctrl-C interrupts it). Short, so that a holder of a second or less is still seen and named."""

# A context variable, not a global: `robo-pipe serve` runs several flow runs in one process,
# and each flow's tasks run in copies of its context.
_RUN_LABEL: ContextVar[str | None] = ContextVar("robo_pipe_run_label", default=None)


def set_run_label(label: str) -> None:
    """Name the run this process (this context: a Prefect flow run) works for; other processes
    waiting for an output it writes show this name (a flow run name, a run folder name)."""
    _RUN_LABEL.set(label)


@dataclass(frozen=True)
class Holder:
    """Who holds (or held) an output's lock, as its owner file says."""

    run: str | None
    pid: int
    host: str
    stage: str
    since: str

    def describe(self) -> str:
        """``run <label> (pid N)``, the host added when it is another machine's."""
        where = "" if self.host == socket.gethostname() else f" on {self.host}"
        pid = f"pid {self.pid}{where}"
        return f"run {self.run} ({pid})" if self.run else pid


def lock_files(path: Path) -> tuple[Path, Path]:
    """The lock file and the owner file of ``path``'s lock (beside it, never inside: the output's
    own contents stay exactly what the stage writes)."""
    path = Path(path).resolve()  # one lock whichever way (symlink, relative) it is named
    return path.with_name(f".{path.name}.lock"), path.with_name(f".{path.name}.owner.json")


def read_holder(owner_file: Path) -> Holder | None:
    """The holder an owner file names; None when there is none (or it cannot be read)."""
    try:
        return Holder(**json.loads(owner_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


@contextmanager
def output_lock(
    path: Path, stage: str, on_status: StatusFn | None = None
) -> Iterator[Holder | None]:
    """Hold the inter-process lock on output ``path`` (a file or directory) for the block.

    When another process holds it, ``on_status`` gets ``waiting for run <label> (pid N) to
    finish <stage> of <path>`` (again if a third run gets the lock first) and this one waits,
    trying again every :data:`POLL_S` seconds. When the previous holder died inside its
    block, ``on_status`` gets ``run <label> (pid N) died during <stage>: taking over <path> and
    resuming``, and the block receives that dead :class:`Holder` (else None).
    """
    lock_file, owner_file = lock_files(path)
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(lock_file)
    waiting = False
    named: Holder | None = None  # the holder last said to be waited for
    while True:
        try:
            lock.acquire(timeout=0)  # one try; the sleep below is the wait
            break
        except Timeout:  # held: say by whom (again when another run got it first), then wait
            holder = read_holder(owner_file)
            if not waiting or (holder is not None and holder != named):
                who = holder.describe() if holder else "another run"
                _say(on_status, f"waiting for {who} to finish {stage} of {path}")
                named = holder
            waiting = True
            time.sleep(POLL_S)
    try:
        dead = read_holder(owner_file)  # a clean release removes it: its holder died
        if dead is not None:
            _say(
                on_status,
                f"{dead.describe()} died during {dead.stage}: taking over {path} and resuming",
            )
        _write_owner(owner_file, stage)
        try:
            yield dead
        finally:
            owner_file.unlink(missing_ok=True)  # before the release: the next holder finds none
    finally:
        lock.release()


def _write_owner(owner_file: Path, stage: str) -> None:
    holder = Holder(
        run=_RUN_LABEL.get(),
        pid=os.getpid(),
        host=socket.gethostname(),
        stage=stage,
        since=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    # Written aside and renamed: a waiter reading it never sees half of it.
    tmp = owner_file.with_name(f"{owner_file.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(holder)))
    os.replace(tmp, owner_file)


def _say(on_status: StatusFn | None, line: str) -> None:
    if on_status is not None:
        on_status(line)
