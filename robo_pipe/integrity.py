"""Checksums of what robo-pipe writes, verified whenever it is read; and writing that never
leaves a partial output behind.

Every directory a stage writes (a dataset, a checkpoint, an export) carries a manifest of its
files, written after them::

    {"format": "robo-pipe-checksums/1",
     "files": {"<relative POSIX path>": {"size": <bytes>, "sha256": "<hex>"}, ...}}

:func:`verify_checksums` checks a directory against its manifest before anything uses it: a
listed file that is missing or a present one that is not listed, then every size (a truncated
file is caught without hashing), then every sha256 (streamed, each file read once). It returns
the verified entries, so that a content hash over the directory (:func:`tree_sha256`) needs no
second read. A failure is an :class:`IntegrityError` naming the file and the check.

:func:`writing` wraps the writing of an output through temporary files: on any failure they are
removed, and a full disk becomes :class:`~robo_pipe.errors.OutOfSpaceError`.

Standard library only (the kernel): the edge runtime verifies bundles with it too.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from robo_pipe.atomic import temporary_path
from robo_pipe.errors import OutOfSpaceError, RoboPipeError, out_of_space_errno

CHECKSUMS_FILE = "checksums.json"
"""The manifest's default name, in the directory it covers."""
FORMAT = "robo-pipe-checksums/1"
"""The manifest's ``format`` tag."""


class IntegrityError(RoboPipeError, ValueError):
    """A file does not match the checksums recorded when it was written.

    ``path`` is the file at fault (the first, when several are) and ``check`` the check it
    failed: ``checksums`` (no manifest, or an unreadable one), ``missing`` (listed, not there),
    ``unlisted`` (there, not listed), ``size`` or ``sha256``. The message has one line per file
    at fault, each naming the file and the check."""

    def __init__(self, path: str | Path, check: str, message: str) -> None:
        super().__init__(message)
        self.path = Path(path)
        self.check = check

    def __reduce__(self) -> tuple[type[IntegrityError], tuple[str, str, str]]:
        # Pickled across processes (a Ray worker's failure) with all three arguments.
        return type(self), (str(self.path), self.check, str(self))


@dataclass(frozen=True)
class FileSum:
    """One file's entry in a checksums manifest."""

    size: int
    """Bytes."""
    sha256: str
    """Hex sha256 of the bytes."""


def file_sha256(path: str | Path) -> str:
    """Hex sha256 of a file's bytes, streamed (constant memory, whatever the file's size)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def file_sums(root: str | Path, files: Iterable[str | Path]) -> dict[str, FileSum]:
    """Size and sha256 of each of ``files`` (paths under ``root``, or relative to it), keyed by
    the relative POSIX path: what :func:`write_checksums` records."""
    base = Path(root)
    sums = {}
    for file in files:
        path = base / file
        sums[path.relative_to(base).as_posix()] = FileSum(path.stat().st_size, file_sha256(path))
    return sums


def write_checksums(
    root: str | Path, sums: Mapping[str, FileSum], name: str = CHECKSUMS_FILE
) -> Path:
    """Write the manifest ``root/name`` listing ``sums`` (relative path -> size and sha256),
    atomically (written beside, then renamed). Returns its path."""
    path = Path(root) / name
    data = {
        "format": FORMAT,
        "files": {rel: {"size": s.size, "sha256": s.sha256} for rel, s in sorted(sums.items())},
    }
    tmp = temporary_path(path)
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def read_checksums(
    root: str | Path, name: str = CHECKSUMS_FILE, fix: str = ""
) -> dict[str, FileSum]:
    """The entries of the manifest ``root/name``. Raises :class:`IntegrityError` (check
    ``checksums``) when it is missing or unreadable; ``fix`` says what to do about it."""
    path = Path(root) / name
    suffix = f"; {fix}" if fix else ""
    if not path.is_file():
        raise IntegrityError(
            path,
            "checksums",
            f"{path}: checksums check failed: no checksums recorded (written by a robo-pipe "
            f"that did not record them, or copied without {name}), so it cannot be "
            f"verified{suffix}",
        )
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r} is not {FORMAT!r}")
        sums = {}
        for rel, entry in data["files"].items():
            parts = PurePosixPath(rel).parts
            if not parts or PurePosixPath(rel).is_absolute() or ".." in parts:
                raise ValueError(f"{rel!r} is not a path inside the directory")
            sums[rel] = FileSum(int(entry["size"]), str(entry["sha256"]))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        raise IntegrityError(
            path, "checksums", f"{path}: checksums check failed: unreadable ({err}){suffix}"
        ) from err
    return sums


def verify_checksums(
    root: str | Path,
    present: Iterable[str | Path],
    name: str = CHECKSUMS_FILE,
    fix: str = "",
    only: Iterable[str] | None = None,
) -> dict[str, FileSum]:
    """Check the directory ``root`` against its manifest ``name``; return the verified entries.

    ``present``: the files of ``root`` the manifest must cover (paths under ``root`` or relative
    to it), e.g. every file of a dataset but not its staging area. In order, each failure naming
    the file: a listed file that is not there (``missing``) or a present one that is not listed
    (``unlisted``); a size that differs (``size``: a truncated file, found without hashing);
    then a sha256 that differs (``sha256``), each file hashed once, streamed. ``only``: check
    the size and sha256 of just these entries (the listing is still checked whole), for a
    reader that verifies its files in steps. ``fix`` ends each message: what to do about it.

    Raises:
        IntegrityError: one line per file at fault; ``path`` and ``check`` of the first.
    """
    base = Path(root)
    sums = read_checksums(base, name, fix)
    suffix = f"; {fix}" if fix else ""
    found = {(base / p).relative_to(base).as_posix() for p in present} - {name}
    problems: list[tuple[str, str, str]] = []  # (relative path, check, detail)
    for rel in sorted(set(sums) - found):
        problems.append((rel, "missing", f"listed in {name} but not there"))
    for rel in sorted(found - set(sums)):
        problems.append((rel, "unlisted", f"there but not listed in {name} (added since)"))
    checked = sorted(set(sums) & found & (set(sums) if only is None else set(only)))
    for rel in checked:
        size = (base / rel).stat().st_size
        if size != sums[rel].size:
            detail = f"{size} bytes, {name} records {sums[rel].size} (truncated or changed)"
            problems.append((rel, "size", detail))
    if not problems:
        for rel in checked:
            actual = file_sha256(base / rel)
            if actual != sums[rel].sha256:
                detail = (
                    f"its sha256 is {actual[:16]}..., {name} records {sums[rel].sha256[:16]}... "
                    "(corrupted or changed since it was written)"
                )
                problems.append((rel, "sha256", detail))
    if problems:
        rel, check, _ = problems[0]
        lines = [f"{base / r}: {c} check failed: {d}{suffix}" for r, c, d in problems]
        raise IntegrityError(base / rel, check, "\n".join(lines))
    return sums if only is None else {rel: sums[rel] for rel in checked}


def tree_sha256(digests: Iterable[tuple[str, str]]) -> str:
    """sha256 over (relative path, file sha256) pairs in the order given: the content hash of
    a directory, computed from its files' digests (e.g. those :func:`verify_checksums`
    returns) instead of reading the files again."""
    digest = hashlib.sha256()
    for rel, sha256 in digests:
        digest.update(rel.encode())
        digest.update(b"\0")
        digest.update(sha256.encode())
    return digest.hexdigest()


@contextmanager
def writing(
    output: str | Path, *temporary: str | Path, kept: str = "nothing complete was replaced"
) -> Iterator[None]:
    """Around code that writes ``output`` through ``temporary`` files or directories, which it
    renames into place only once complete. On any failure the temporary paths are removed, so
    no partial output is left to be taken for a finished one; a failure for want of space
    (disk, quota or file size limit) becomes :class:`~robo_pipe.errors.OutOfSpaceError` naming
    the file, with ``kept`` saying what complete output is still there."""
    try:
        yield
    except BaseException as err:
        for path in map(Path, temporary):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        code = out_of_space_errno(err)
        if code is None or isinstance(err, OutOfSpaceError):
            raise
        file = getattr(err, "filename", None) or output
        raise OutOfSpaceError.writing(code, file, output, kept) from err
