"""How a verb stops: SIGTERM raised as Ctrl-C's ``KeyboardInterrupt`` (:class:`Stopped`), a
Prefect server that stops answering as a stop of its own (:class:`ServerLost`), the exit code
each gives, and stop signals held back while servers start or stop."""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

from pipelines.services.settings import Services, healthy, no_prefect_retries


class Stopped(KeyboardInterrupt):
    """A stop signal, raised in the main thread as Ctrl-C's ``KeyboardInterrupt`` is: SIGTERM
    (see :func:`stop_on_sigterm`), or either signal once ``serve``'s runner has stopped;
    ``signum`` says which."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_on_sigterm() -> None:
    """Make SIGTERM raise :class:`Stopped` (a ``KeyboardInterrupt``) in this process, so that
    SIGTERM and Ctrl-C stop it the same way: through the ``finally`` blocks that stop what it
    started. For the long-running verbs (ui, serve, edge-agent, run): each installs it just
    before the ``try`` whose ``finally`` stops what it starts, and exits with
    :func:`interrupted_exit_code`. (Before that, SIGTERM's default ends the process at once,
    which a shell reports as 143 too; a ``Stopped`` that left the verb would exit 130, as
    Typer gives any ``KeyboardInterrupt``.)

    SIGINT keeps its disposition. A shell starts ``cmd &`` from a script with SIGINT ignored
    (so that a Ctrl-C meant for the script's foreground command does not reach it), and Python
    then installs no ``KeyboardInterrupt`` for SIGINT: that choice of the caller stands. SIGTERM
    (``kill``, ``timeout``, systemd, Docker) always stops the process, whatever SIGINT is.

    A stop that lands in a finalizer is delivered again (:func:`_stop_again`).
    """
    signal.signal(signal.SIGTERM, _raise_stopped)
    if sys.unraisablehook is not _stop_again:
        _hooks.append(sys.unraisablehook)
        sys.unraisablehook = _stop_again


@contextmanager
def sigterm_kept_in_flows() -> Iterator[None]:
    """Flows run in this block leave SIGTERM to this process's handler
    (:func:`stop_on_sigterm`: :class:`Stopped`, a ``KeyboardInterrupt``).

    Prefect's flow engine replaces it while a flow runs with one that raises its
    ``TerminationSignal``, for a runner that cancels a flow run it started (``serve``'s runs,
    not a ``run`` verb's). That is no ``KeyboardInterrupt``, and Ray's ``ray.get``, which checks
    for signals while it waits, passes only a ``KeyboardInterrupt`` on at once: it holds any
    other exception until what it waits for ends (a whole Ray Train fit), then raises it as a
    ``SystemError``. Swaps the ``capture_sigterm`` name Prefect 3.8's flow engine uses, for the
    block (Prefect has no setting for it); the flow run still ends Cancelled
    (:func:`pipelines.run.flow_run.cancelled_if_stopped`)."""
    from prefect import flow_engine

    plain = flow_engine.capture_sigterm
    flow_engine.capture_sigterm = nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        flow_engine.capture_sigterm = plain


_received: list[int] = []
"""The signals :func:`stop_on_sigterm`'s handler turned into :class:`Stopped`, in order."""


def _raise_stopped(signum: int, _frame: object) -> None:
    _received.append(signum)
    raise Stopped(signum)


STOP_AGAIN_AFTER_S = 0.05
"""Seconds after a stop was swallowed by a finalizer before it is sent again: past the end of
the hook that saw it."""

_hooks: list[Any] = []
"""The ``sys.unraisablehook`` :func:`stop_on_sigterm` replaced."""


def _stop_again(unraisable: Any) -> None:
    """``sys.unraisablehook``: a stop raised while a finalizer ran (a ``__del__``, a weakref
    callback in a garbage collection) cannot leave it: Python prints "Exception ignored in" and
    goes on, and the run would go on to its end. The signal is sent again a moment later from
    another thread (sent at once, its handler would run here, still inside the finalizer), to
    stop the process where it is next interruptible; anything else goes to the hook there
    was."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        signum = stop_signal(unraisable.exc_value)
        threading.Timer(STOP_AGAIN_AFTER_S, os.kill, (os.getpid(), signum)).start()
        return
    _hooks[0](unraisable)


def stop_signal(interrupt: KeyboardInterrupt) -> int:
    """The signal that ``interrupt`` stands for. Ray's ``ray.get`` ends its wait for any
    ``KeyboardInterrupt`` a signal handler raised with a new plain one, so a SIGTERM that
    stopped a Ray stage reaches the verb as Ctrl-C's exception: the handler's record says
    which it was. A plain one with no record is Ctrl-C's (SIGINT)."""
    if isinstance(interrupt, Stopped):
        return interrupt.signum
    return _received[-1] if _received else signal.SIGINT


def prefect_server_gone(found: Services) -> str | None:
    """The line that says so if the Prefect server ``found`` reports to (a ``robo-pipe ui``'s,
    or a configured ``PREFECT_API_URL``) does not answer now; None if it does or there is none
    (a temporary server per run lives in this process)."""
    api = (found.prefect_api_url or "").rstrip("/")
    if not api or healthy(f"{api}/health"):
        return None
    whose = f"the servers of {found.servers_of}" if found.servers_of else "PREFECT_API_URL"
    return f"the Prefect server at {api} ({whose}) stopped answering"


class ServerLost(Stopped):
    """The Prefect server a ``run`` reports to stopped answering (:func:`stop_if_server_goes`);
    ``reason`` is the line that says so. The run stops as on SIGTERM and exits 3."""

    def __init__(self, reason: str) -> None:
        super().__init__(signal.SIGTERM)
        self.reason = reason


@contextmanager
def stop_if_server_goes(found: Services, every_s: float = 5.0, misses: int = 3) -> Iterator[None]:
    """Stop the main thread's block with :class:`ServerLost` if the Prefect server at
    ``found.prefect_api_url`` (a ``robo-pipe ui``'s, or one the user configured) misses
    ``misses`` health checks in a row, ``every_s`` apart (a server busy for a few seconds is not
    gone: a false alarm would stop an hour's run): a run would otherwise retry every call for a
    minute and never end. Client retries are turned off first, so that the flow's way out (its
    state, its logs) fails at once instead of waiting for the server. Nothing to watch without
    a server (a temporary one per run lives in this process)."""
    api = (found.prefect_api_url or "").rstrip("/")
    if not api or threading.current_thread() is not threading.main_thread():
        yield
        return

    lost: list[str] = []
    done = threading.Event()

    def watch() -> None:
        missed = 0
        while not done.wait(every_s):
            reason = prefect_server_gone(found)
            missed = 0 if reason is None else missed + 1
            if reason is not None and missed >= misses:
                lost.append(reason)
                no_prefect_retries()
                os.kill(os.getpid(), signal.SIGTERM)  # a real signal wakes a blocked wait
                return

    watcher = threading.Thread(target=watch, name="prefect-api-watch", daemon=True)
    watcher.start()
    try:
        yield
    except KeyboardInterrupt as stopped:  # plain, if ray.get replaced Stopped (stop_signal)
        if lost:
            raise ServerLost(lost[0]) from stopped
        raise
    finally:
        done.set()


def drop_unsent_if_server_gone(found: Services) -> int:
    """If the Prefect server at ``found.prefect_api_url`` does not answer: empty the queues of
    Prefect's log and event workers and stop them, and return how many records were dropped
    (else 0, and nothing changes). What they hold cannot be delivered, and at the
    interpreter's exit Prefect waits for each queued record to fail (about 7 s per event):
    a run that outlived its server would not end for minutes. Reads Prefect 3.8's private
    ``_instances`` and ``_queue`` (it has no public way to abandon a queue)."""
    if prefect_server_gone(found) is None:
        return 0
    import queue

    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    no_prefect_retries()
    dropped = 0
    workers: tuple[Any, ...] = (APILogWorker, EventsWorker)
    for service in workers:
        for instance in list(service._instances.values()):
            while True:
                try:
                    instance._queue.get_nowait()
                except queue.Empty:
                    break
                instance._queue.task_done()
                dropped += 1
            instance._stop()
    return dropped


def stop_behind(error: BaseException) -> BaseException | None:
    """The stop signal's exception (a ``KeyboardInterrupt``, or Prefect's ``TerminationSignal``
    while its flow engine holds SIGTERM) that ``error`` stands for, if it has one as its cause
    or context; else None. A signal's handler raises in whatever Python code the main thread
    runs: inside a C extension's callback (Ray deserializing what ``ray.get`` returns) the
    extension reports the exception as a ``SystemError`` "returned a result with an exception
    set", and the stop would read as a failed stage."""
    from prefect.exceptions import TerminationSignal

    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, KeyboardInterrupt | TerminationSignal):
            return cause
        cause = cause.__cause__ or cause.__context__
    return None


def interrupted_exit_code(interrupt: KeyboardInterrupt) -> int:
    """The exit code of a process that ``interrupt`` stopped: 128 + the signal's number, as a
    shell reports a process a signal ended (130 for Ctrl-C/SIGINT, 143 for SIGTERM)."""
    if isinstance(interrupt, ServerLost):
        return 3  # a service robo-pipe needs failed (docs/exit-codes.md)
    return 128 + stop_signal(interrupt)


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM received inside the block take effect when it ends (main thread
    only: elsewhere Python delivers no signals anyway)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda got, _: received.append(got))
        for signum in (signal.SIGINT, signal.SIGTERM)
        if signal.getsignal(signum) is not signal.SIG_IGN  # an ignored signal stays ignored
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if received:
            signal.raise_signal(received[0])
