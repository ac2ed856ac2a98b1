"""The one base for every error a user can cause.

A :class:`RoboPipeError` is a mistake in the input (a config field, a path, a model URI, a
target, a dataset or bundle that is corrupt or tampered with, a cluster that does not answer):
the CLI prints its message (which names the file, field or value) and exits 2, with no
traceback. Any other exception is a bug in robo-pipe and shows its traceback (exit 1).

Subclasses keep a builtin base too (``ValueError`` for bad values, ``RuntimeError`` for a
failed run) so that code that catches those, e.g. pydantic validators, keeps working.
"""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path


class RoboPipeError(Exception):
    """An error the user can fix: the message names the input and what is wrong with it."""


class ServiceFailure(RoboPipeError):
    """A service robo-pipe needs failed or cannot be reached (a Prefect API or MLflow server that
    does not answer, a Ray cluster or its workers that died, an embedded store damaged beyond
    repair). The CLI prints the message, which names the service, and exits 3, like a crash:
    re-running cannot help until the service is back, and nothing in the input is wrong."""

    exit_code = 3


class InputError(RoboPipeError, ValueError):
    """A path or value given to a command cannot be used (e.g. an output path that is a file)."""


DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})
"""A write failed for want of space: the disk or quota is full, or the file size limit is hit
(``RLIMIT_FSIZE``; Python ignores SIGXFSZ, so the write raises ``EFBIG``)."""

_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
"""How Rust's ``std::io::Error`` shows an errno: safetensors and tokenizers raise their own
exception types, without ``errno``, whose message ends like this."""


class OutOfSpaceError(RoboPipeError, OSError):
    """The disk filled up (or the file size limit was hit) while robo-pipe wrote an output.

    The message names the file, says that the partial output was removed and what complete
    output was kept, and that re-running the same command once there is space resumes.
    ``errno`` is the failed write's (``ENOSPC``, ``EFBIG`` or ``EDQUOT``)."""

    def __init__(self, message: str, code: int | None) -> None:
        super().__init__(message)
        self.errno = code  # set after: OSError's own message format would replace ours

    def __reduce__(self) -> tuple[type[OutOfSpaceError], tuple[str, int | None]]:
        # Pickled across processes (a Ray worker's failure) with both arguments.
        return type(self), (str(self), self.errno)

    @classmethod
    def writing(cls, code: int, file: str | Path, output: str | Path, kept: str) -> OutOfSpaceError:
        """The error for a write of ``file`` (part of ``output``) that failed with ``code``;
        ``kept`` says what complete output is still there."""
        return cls(
            f"{file}: the disk is full ({os.strerror(code)}) while writing {output}; the partial "
            f"output was removed and {kept}; free some space and re-run the same command: it "
            "resumes",
            code,
        )


def out_of_space_errno(err: BaseException) -> int | None:
    """The errno of ``err`` (or of an exception it was raised from) when it says the disk is
    full; None for any other failure."""
    seen: set[int] = set()
    current: BaseException | None = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        code = getattr(current, "errno", None) if isinstance(current, OSError) else None
        if code is None:
            found = _RUST_OS_ERROR.search(str(current))
            code = int(found.group(1)) if found else None
        if code in DISK_FULL_ERRNOS:
            return code
        current = current.__cause__ or current.__context__
    return None
