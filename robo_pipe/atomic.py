"""Replacing an output with no crash window, and temporaries that say who writes them.

Every output (a checkpoint, an export, a dataset, a shard) is written complete under a
temporary name beside its place (:func:`temporary_path`), made durable (:func:`fsync_tree`:
every file and directory fsynced, so a power cut never leaves a renamed directory with empty
files), then put in place by :func:`replace_dir`. On Linux (3.15 and later, on ext4, xfs,
btrfs, tmpfs...) that is one ``renameat2(RENAME_EXCHANGE)``: the new and the old directory
swap names in a single step, and only then is the old one (now under the temporary name)
removed. At every moment the output's path holds a complete output, the old one or the new
one, and readers need no change: no symlink, no pointer file. Elsewhere (macOS, NFS, where the
exchange is unsupported) the old directory is renamed away and the new one renamed in: the
path is missing between those two renames.

A temporary's name is ``.<name>.tmp-<pid>@<host>.<nonce>``: :func:`discard_dead_temporaries`
removes one only when its owner is a process of this host that no longer exists (a kill, a
power cut). A live writer's temporary, another host's (whose processes cannot be checked
from here) and a name that does not say its owner are left alone.

Standard library only (the kernel).
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
import shutil
import socket
import uuid
from collections.abc import Callable
from pathlib import Path

_TEMPORARY = re.compile(r"\.tmp-(?P<pid>\d+)@(?P<host>.+)\.[0-9a-f]{8}$")
"""The end of a temporary's name: its owner's pid and host, and a nonce."""

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EPERM}
"""What ``renameat2`` answers where the kernel or the filesystem cannot exchange (EPERM: a
container's seccomp filter; a real permission problem then fails the fallback's rename)."""


def _load_renameat2() -> Callable[..., int] | None:
    try:
        return getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    except (OSError, TypeError):  # no C library to open by that name (not Linux)
        return None


_renameat2 = _load_renameat2()


def temporary_path(path: str | Path) -> Path:
    """A hidden, unique name beside ``path`` to write it under, naming this process as its
    owner: ``.<name>.tmp-<pid>@<host>.<nonce>``."""
    path = Path(path)
    owner = f"{os.getpid()}@{socket.gethostname()}"
    return path.with_name(f".{path.name}.tmp-{owner}.{uuid.uuid4().hex[:8]}")


def owner_alive(name: str) -> bool:
    """Whether the temporary called ``name`` may still be written: True unless its name says
    its owner is a process of this host that no longer exists."""
    match = _TEMPORARY.search(name)
    if match is None or match["host"] != socket.gethostname():
        return True  # no owner named, or another machine's: nothing here can say it is dead
    try:
        os.kill(int(match["pid"]), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that pid: alive
        return True
    return True


def discard_dead_temporaries(directory: str | Path, of: str | None = None) -> list[Path]:
    """Remove the temporaries in ``directory`` (of the output named ``of`` only, when given)
    whose owner is dead (:func:`owner_alive`); return them. A live run's are never touched."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    prefix = f".{of}.tmp-" if of is not None else ""
    removed = []
    for path in sorted(directory.iterdir()):
        name = path.name
        if ".tmp-" not in name or not name.startswith(prefix) or owner_alive(name):
            continue
        _remove(path)
        removed.append(path)
    return removed


def fsync_tree(path: str | Path) -> None:
    """fsync every file and directory under ``path`` (and ``path`` itself), so that what a rename
    is about to publish is on disk: files before the directories that name them. Files written
    by libraries (safetensors, parquet, onnx) are synced here, after the fact, in one place."""
    root = Path(path)
    if not root.is_dir():
        _fsync(root, os.O_RDONLY)
        return
    for folder, dirs, files in os.walk(root, topdown=False):
        for name in files:
            file = Path(folder, name)
            if not file.is_symlink():
                _fsync(file, os.O_RDONLY)
        for name in dirs:
            if not Path(folder, name).is_symlink():
                _fsync(Path(folder, name), os.O_RDONLY | os.O_DIRECTORY)
    _fsync(root, os.O_RDONLY | os.O_DIRECTORY)


def fsync_dir(path: str | Path) -> None:
    """fsync the directory ``path``: makes the renames and links inside it durable."""
    _fsync(Path(path), os.O_RDONLY | os.O_DIRECTORY)


def replace_dir(new: str | Path, target: str | Path) -> None:
    """Put the complete directory ``new`` (beside ``target``, same filesystem) at ``target``,
    replacing what is there, with no moment at which ``target`` is missing or partial.

    ``new`` is fsynced whole first; then, where ``target`` exists, the two are exchanged in one
    step (``renameat2(RENAME_EXCHANGE)``) and the old output, now at ``new``, is removed; the
    parent is fsynced so the swap survives a power cut. Where the exchange is unsupported the
    old output is renamed away to a temporary and ``new`` renamed in (a short window without
    ``target``). A kill at any point leaves ``target`` whole and at most a temporary of a dead
    process (:func:`discard_dead_temporaries`)."""
    new, target = Path(new), Path(target)
    fsync_tree(new)
    if not os.path.lexists(target):
        os.rename(new, target)
        fsync_dir(target.parent)
    elif _exchange(new, target):
        fsync_dir(target.parent)  # the swap is durable before the old output goes
        _remove(new)
    else:
        old = temporary_path(target)
        os.rename(target, old)
        os.rename(new, target)
        fsync_dir(target.parent)
        _remove(old)


def remove_dir(path: str | Path) -> None:
    """Remove the directory ``path``, renaming it to a temporary first: a kill halfway leaves a
    dead process's temporary, never half of an output under its own name."""
    path = Path(path)
    if not os.path.lexists(path):
        return
    doomed = temporary_path(path)
    os.rename(path, doomed)
    _remove(doomed)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names ``a`` and ``b`` in one step; False where the system cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in _UNSUPPORTED:
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


def _fsync(path: Path, flags: int) -> None:
    fd = os.open(path, flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
