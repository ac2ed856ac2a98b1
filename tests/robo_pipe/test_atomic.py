"""Replacing an output with no crash window (a kill before any step leaves a whole output), its
durability (everything fsynced before the rename), and clean-up that spares live writers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from robo_pipe import atomic
from robo_pipe.atomic import (
    discard_dead_temporaries,
    owner_alive,
    remove_dir,
    replace_dir,
    temporary_path,
)

STEPS: tuple[tuple[Any, str], ...] = (
    (os, "mkdir"),
    (os, "rename"),
    (os, "replace"),
    (os, "link"),
    (os, "unlink"),
    (os, "rmdir"),
    (os, "fsync"),
    (atomic, "_exchange"),
)
"""The file system operations a kill is put before: each is one step of a write."""


def killed_at_step(step: int, action: Callable[[], object]) -> bool:
    """Run ``action`` in a forked child that SIGKILLs itself just before its ``step``-th file
    system operation (:data:`STEPS`); True when it was killed, False when ``action`` finished
    in fewer steps."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into the test runner
        try:
            count = 0

            def before(real: Callable[..., Any]) -> Callable[..., Any]:
                def step_then(*args: Any, **kwargs: Any) -> Any:
                    nonlocal count
                    count += 1
                    if count == step:
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real(*args, **kwargs)

                return step_then

            for module, name in STEPS:
                setattr(module, name, before(getattr(module, name)))
            action()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.WIFSIGNALED(status)


def kill_at_every_step(
    action: Callable[[], object], check: Callable[[int], None], limit: int = 400
) -> int:
    """Kill ``action`` before each of its steps in turn, calling ``check(step)`` after each kill
    and once more after it runs to the end; return how many kills there were."""
    for step in range(1, limit):
        killed = killed_at_step(step, action)
        check(step)
        if not killed:
            return step - 1
    raise AssertionError(f"more than {limit} steps")


def write_version(directory: Path, version: str) -> None:
    """A small output whose every file says which ``version`` it belongs to."""
    (directory / "sub").mkdir(parents=True)
    for name in ("a", "b", "sub/c"):
        (directory / name).write_text(f"{version} {name}")


def read_version(directory: Path) -> str:
    """The version every file of ``directory`` holds; fails when it is partial or mixed."""
    files = {
        p.relative_to(directory).as_posix(): p.read_text()
        for p in directory.rglob("*")
        if p.is_file()
    }
    assert sorted(files) == ["a", "b", "sub/c"], f"partial: {sorted(files)}"
    versions = {text.split()[0] for text in files.values()}
    assert len(versions) == 1, f"mixed: {files}"
    return versions.pop()


def test_a_replace_killed_before_any_step_leaves_a_whole_output(tmp_path: Path) -> None:
    target = tmp_path / "out"
    write_version(target, "v0")
    seen: set[str] = set()

    def save_next() -> None:
        new = temporary_path(target)
        write_version(new, "v1" if read_version(target) == "v0" else "v0")
        replace_dir(new, target)

    def check(step: int) -> None:
        seen.add(read_version(target))  # whole, never missing, at every step
        discard_dead_temporaries(tmp_path)  # the killed child's leftovers
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"], f"step {step}"

    kills = kill_at_every_step(save_next, check)
    assert kills >= 12 and seen == {"v0", "v1"}


def test_everything_is_fsynced_before_it_is_renamed_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, events = tmp_path / "out", []
    write_version(target, "v0")
    new = temporary_path(target)
    write_version(new, "v1")
    real_fsync, real_exchange = atomic._fsync, atomic._exchange

    def fsync(path: Path, flags: int) -> None:
        events.append(("fsync", str(path)))
        real_fsync(path, flags)

    def exchange(a: Path, b: Path) -> bool:
        events.append(("exchange", str(b)))
        return real_exchange(a, b)

    monkeypatch.setattr(atomic, "_fsync", fsync)
    monkeypatch.setattr(atomic, "_exchange", exchange)
    replace_dir(new, target)
    swap = events.index(("exchange", str(target)))
    before = {path for op, path in events[:swap]}
    assert {str(p) for p in new.rglob("*")} | {str(new)} <= before, "files and directories"
    assert ("fsync", str(tmp_path)) in events[swap:], "the parent, after the swap"
    assert read_version(target) == "v1" and sorted(os.listdir(tmp_path)) == ["out"]


def test_without_the_exchange_the_old_output_is_renamed_away_then_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "out"
    write_version(target, "v0")
    new = temporary_path(target)
    write_version(new, "v1")
    monkeypatch.setattr(atomic, "_renameat2", None)  # not Linux
    replace_dir(new, target)
    assert read_version(target) == "v1" and sorted(os.listdir(tmp_path)) == ["out"]


def test_a_removal_never_leaves_half_an_output_under_its_name(tmp_path: Path) -> None:
    target = tmp_path / "step-0000001"

    def check(step: int) -> None:
        if target.exists():
            assert read_version(target) == "v0", f"step {step}"
        discard_dead_temporaries(tmp_path)

    write_version(target, "v0")
    assert kill_at_every_step(lambda: remove_dir(target), check) >= 1
    assert not target.exists() and not os.listdir(tmp_path)


@contextmanager
def live_process() -> Iterator[int]:
    """The pid of a process of this host that stays alive inside the block."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        yield child.pid
    finally:
        child.kill()
        child.wait()


@pytest.fixture()
def live_pid() -> Iterator[int]:
    """A process of this host that stays alive during the test."""
    with live_process() as pid:
        yield pid


def dead_pid() -> int:
    """A pid no process has (one that has just exited and been reaped)."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_clean_up_removes_only_temporaries_of_dead_processes(tmp_path: Path, live_pid: int) -> None:
    host, other = socket.gethostname(), "another-host.example"
    dead = dead_pid()
    names = {
        "live": f".out.tmp-{live_pid}@{host}.0123abcd",
        "dead": f".out.tmp-{dead}@{host}.0123abcd",
        "dead_file": f".out.tmp-{dead}@{host}.4567abcd",
        "other_host": f".out.tmp-{dead}@{other}.0123abcd",
        "no_owner": ".out.tmp-0123abcd",
        "other_output": f".other.tmp-{dead}@{host}.0123abcd",
        "output": "out",
    }
    for key, name in names.items():
        if key == "dead_file":
            (tmp_path / name).write_text("half")
        else:
            write_version(tmp_path / name, "v0")
    assert not owner_alive(names["dead"]) and owner_alive(names["live"])
    removed = discard_dead_temporaries(tmp_path, of="out")
    assert sorted(p.name for p in removed) == sorted([names["dead"], names["dead_file"]])
    left = set(os.listdir(tmp_path))
    assert left == set(names.values()) - {names["dead"], names["dead_file"]}
    assert [p.name for p in discard_dead_temporaries(tmp_path)] == [names["other_output"]]
    assert read_version(tmp_path / names["live"]) == "v0", "a live writer's is untouched"


def test_a_temporary_names_its_writer(tmp_path: Path) -> None:
    path = temporary_path(tmp_path / "ckpt")
    assert path.parent == tmp_path and path.name.startswith(".ckpt.tmp-")
    assert f"-{os.getpid()}@{socket.gethostname()}." in path.name and owner_alive(path.name)
