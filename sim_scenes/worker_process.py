"""A simulator's worker process, seen from robo-pipe's side: find the simulator environment's
Python, start a worker module with it, exchange :mod:`sim_scenes.worker_protocol` messages, and
report a worker that fails with its log.

The worker's own output (the simulator's logs) goes to a log file whose tail is quoted when the
worker fails; the file is deleted on a clean close. The worker exits when this side closes, and
also when this process dies (it reads end-of-file on the socket).
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from robo_pipe.errors import RoboPipeError
from sim_scenes.worker_protocol import receive, send

REPO_ROOT = Path(__file__).resolve().parents[1]


def simulator_python(
    name: str, env_var: str, default_env: Path, make_target: str, missing: type[RoboPipeError]
) -> Path:
    """Simulator ``name``'s environment's Python: ``$env_var`` if set, else
    ``default_env/bin/python`` (``~`` is the user's home).

    Raises:
        missing: no file there; the message names ``make <make_target>`` and ``$env_var``.
    """
    configured = os.environ.get(env_var)
    python = Path(configured) if configured else default_env.expanduser() / "bin" / "python"
    if not python.is_file():
        origin = f"${env_var}" if configured else "the default location"
        raise missing(
            f"{python}: no {name} Python there ({origin}); create the environment with "
            f"`make {make_target}`, or set ${env_var} to its python"
        )
    return python


class WorkerError(RuntimeError):
    """A worker process failed; the message carries its traceback and log tail."""


class WorkerRefusal(RoboPipeError, ValueError):
    """The worker refused a request the user's input made (an unknown task or camera name);
    the message names the value and the valid ones."""


class WorkerProcess:
    """``python -m <module> --fd N`` started from the checkout, ``N`` its end of a socket pair.

    Args:
        python: the simulator environment's interpreter.
        module: the worker module (it answers :mod:`~sim_scenes.worker_protocol` messages).
        label: names the worker in errors ("Meta-World worker failed").
        error: the :class:`WorkerError` subclass raised when it fails.
    """

    def __init__(
        self, python: Path, module: str, label: str, error: type[WorkerError] = WorkerError
    ) -> None:
        self.label, self._error = label, error
        self._keep_log = False
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - lives as long as the worker
            prefix=f"robo-pipe-{module.rsplit('.', 2)[-2]}-", suffix=".log", delete=False
        )
        parent_sock, child_sock = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
        try:
            self._proc: subprocess.Popen[bytes] | None = subprocess.Popen(
                [str(python), "-m", module, "--fd", str(child_sock.fileno())],
                pass_fds=(child_sock.fileno(),),
                cwd=REPO_ROOT,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
        finally:
            child_sock.close()
        self._conn: Connection | None = Connection(parent_sock.detach())

    @property
    def closed(self) -> bool:
        return self._conn is None

    def request(
        self, op: str, expect: str, timeout: float | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Send ``op`` and wait (up to ``timeout`` s, or for ever) for the ``expect`` reply.

        Raises:
            WorkerRefusal: the worker answered ``refused`` (a bad name in the request).
            WorkerError: (the subclass given) the worker failed, died or did not answer.
        """
        self.submit(op, **fields)
        return self.reply(expect, timeout)

    def submit(self, op: str, **fields: Any) -> None:
        """Send ``op`` without waiting: several workers then work at once, each answering its
        own :meth:`reply`. A worker that is gone is reported by that reply."""
        if self._conn is None:
            raise self._error(f"the {self.label} is closed")
        with contextlib.suppress(OSError):  # the worker is gone: its reply says why
            send(self._conn, op, **fields)

    def reply(self, expect: str, timeout: float | None = None) -> dict[str, Any]:
        """The reply to the last :meth:`submit` (raises as :meth:`request`)."""
        if self._conn is None:
            raise self._error(f"the {self.label} is closed")
        return self._reply(timeout, expect)

    def _reply(self, timeout: float | None, expect: str) -> dict[str, Any]:
        conn, proc = self._conn, self._proc
        assert conn is not None and proc is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while not conn.poll(1.0):  # the worker may die without closing the socket cleanly
            if proc.poll() is not None:
                raise self._error(self._failure(f"exited with code {proc.returncode}"))
            if deadline is not None and time.monotonic() > deadline:
                raise self._error(self._failure(f"did not answer within {timeout:.0f} s"))
        try:
            op, fields = receive(conn)
        except (EOFError, OSError):
            proc.wait(timeout=30)
            raise self._error(self._failure(f"exited with code {proc.returncode}")) from None
        if op == "refused":
            raise WorkerRefusal(fields["reason"])
        if op == "error":
            raise self._error(self._failure("failed", fields["traceback"]))
        if op != expect:
            raise self._error(self._failure(f"answered {op!r}, expected {expect!r}"))
        return fields

    def _failure(self, what: str, traceback: str = "") -> str:
        self._keep_log = True  # the message points at it
        self._log.flush()
        tail = Path(self._log.name).read_text(errors="replace")[-4000:]
        return (
            f"{self.label} {what}.\n{traceback}\n--- worker log {self._log.name} (tail) ---\n{tail}"
        )

    def close(self) -> None:
        """Ask the worker to exit (kill it after 30 s); keep its log only if it failed."""
        conn, proc, self._conn, self._proc = self._conn, self._proc, None, None
        if conn is not None:
            try:
                send(conn, "close")
                if conn.poll(30):
                    receive(conn)
            except (OSError, EOFError):
                pass
            conn.close()
        if proc is not None:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._log.close()
        if not self._keep_log:
            Path(self._log.name).unlink(missing_ok=True)
