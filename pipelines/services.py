"""Where the pipeline's services are: the Prefect API, the MLflow tracking server, and the local
servers ``robo-pipe ui`` starts.

Embedded default (nothing configured):

- **MLflow**: ``sqlite:///$ROBO_PIPE_HOME/mlflow/mlflow.db``, artifacts under
  ``$ROBO_PIPE_HOME/mlflow/artifacts``. ``MLFLOW_TRACKING_URI`` points at any MLflow server.
- **Prefect**: ``PREFECT_HOME=$ROBO_PIPE_HOME/prefect``. If ``PREFECT_API_URL`` is set, flows
  report there; else, if ``robo-pipe ui`` is running, to its server (so runs appear live in its
  UI); else Prefect starts a temporary local server on the same SQLite database, and
  ``robo-pipe ui`` shows those runs later.

:func:`configure` sets the environment both read. Prefect also keeps a process-wide copy of its
settings, made when it is first imported (loading a config with a cron schedule imports it): a
command that configures after that calls :func:`refresh_prefect_settings` (and
:func:`use_prefect_api` does). A stale copy has no API URL, and Prefect then quietly starts a
temporary server of its own for part of the work: the served runner's concurrency leases went
there, and every run ``robo-pipe serve`` started ended Cancelled.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from pipelines.home import (
    default_artifact_root,
    default_tracking_uri,
    home_dir,
    home_path,
    robo_pipe_home,
)
from robo_pipe.errors import InputError, ServiceFailure

SERVICES_FILE = "services.json"
"""Written under the home by ``robo-pipe ui`` (and ``serve`` when it starts its own servers):
the URLs of its servers, its pid and which verb it is."""


class ServiceError(ServiceFailure, RuntimeError):
    """A configured service (Prefect API, MLflow tracking server) cannot be reached."""


@dataclass(frozen=True)
class Services:
    """What this process uses (``robo-pipe info`` prints it)."""

    home: str
    mlflow_tracking_uri: str
    mlflow_ui: str | None
    """The MLflow UI serving that store, when one is known: the tracking server itself, or
    for the embedded store the UI of a running ``robo-pipe ui``."""
    prefect_api_url: str | None
    """None: a temporary local Prefect server per process (ephemeral mode)."""
    prefect_ui: str | None
    prefect_home: str
    servers_of: str | None = None
    """The process whose local servers this one reports to, e.g. ``robo-pipe ui (pid 4321)``:
    a ``robo-pipe ui`` (or ``serve``) running on this home, found through its ``services.json``.
    None if it uses none."""

    def to_json(self) -> dict[str, str | None]:
        """Plain-dict form for JSON output."""
        return asdict(self)

    def servers_note(self) -> str | None:
        """What ``run`` and ``serve`` say when they use another process's servers (None if they
        do not): that process and the URLs, so a run that shows up in someone's UI is no
        surprise."""
        if self.servers_of is None:
            return None
        return (
            f"using the servers of {self.servers_of} on this home: Prefect UI {self.prefect_ui}, "
            f"MLflow UI {self.mlflow_ui or '-'} (stop it, or set PREFECT_API_URL, to use others)"
        )


def configure(create: bool = True) -> Services:
    """Set the environment Prefect and MLflow read (only what the user has not set) and return
    where everything is. Call before importing either. ``create=False`` (the read-only verbs):
    create nothing, not even the home."""
    _default("PREFECT_HOME", str(home_dir("prefect") if create else home_path("prefect")))
    _default("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Prefect gives the temporary server it starts per run 20 s; on a cold machine a first
    # start (imports, database) took longer, and the run failed before any stage.
    _default("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    _default("MLFLOW_DISABLE_TELEMETRY", "true")
    _default("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    if create:  # the embedded store's folder (check_services looks for it)
        home_dir("mlflow")
    _default("MLFLOW_TRACKING_URI", default_tracking_uri())
    ui = running_ui()
    if ui:
        _default("PREFECT_API_URL", ui["prefect_api_url"])
    api = os.environ.get("PREFECT_API_URL") or None
    # PREFECT_UI_URL: where the UI is when it is not the API's server without /api (Cloud).
    prefect_ui = os.environ.get("PREFECT_UI_URL") or (api.removesuffix("/api") if api else None)
    tracking_uri = os.environ["MLFLOW_TRACKING_URI"]
    if urlparse(tracking_uri).scheme in ("http", "https"):
        mlflow_ui: str | None = tracking_uri.rstrip("/")  # a tracking server is its own UI
    else:
        mlflow_ui = ui["mlflow_ui"] if ui and _is_default_store() else None
    servers_of = None
    if ui and (api == ui["prefect_api_url"] or mlflow_ui == ui["mlflow_ui"]):
        servers_of = f"{ui.get('owner', 'robo-pipe ui')} (pid {ui['pid']})"
    return Services(
        home=str(robo_pipe_home()),
        mlflow_tracking_uri=tracking_uri,
        mlflow_ui=mlflow_ui,
        prefect_api_url=api,
        prefect_ui=prefect_ui,
        prefect_home=os.environ["PREFECT_HOME"],
        servers_of=servers_of,
    )


def use_prefect_api(url: str) -> None:
    """Send this process's Prefect calls, and those of the processes it starts, to the API at
    ``url`` (e.g. the server ``robo-pipe serve`` started)."""
    os.environ["PREFECT_API_URL"] = url
    refresh_prefect_settings()


def refresh_prefect_settings() -> None:
    """Make an already imported Prefect re-read its process-wide settings from the environment
    (see the module docstring); nothing to do if Prefect is not imported yet. For commands
    only: under ``prefect_test_harness`` it would replace the harness's settings."""
    if "prefect.context" not in sys.modules:
        return
    from prefect.context import refresh_global_settings_context

    refresh_global_settings_context()


def no_prefect_retries() -> None:
    """From now on, this process's Prefect calls (and those of processes it starts) fail at once
    instead of retrying: for the way out when the Prefect server is gone, where each call would
    otherwise retry for about a minute (``PREFECT_CLIENT_MAX_RETRIES``, 5 with backoff)."""
    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = "0"
    refresh_prefect_settings()


_set_by_us: dict[str, str] = {}


def _default(name: str, value: str) -> None:
    """Set ``name`` unless the user did (a value this module set earlier is ours to change:
    the home may have changed since)."""
    if not os.environ.get(name) or os.environ[name] == _set_by_us.get(name):
        os.environ[name] = value
        _set_by_us[name] = value


def _is_default_store() -> bool:
    return os.environ.get("MLFLOW_TRACKING_URI") == default_tracking_uri()


def check_services(services: Services) -> None:
    """Raise :class:`ServiceError` naming the first configured service that does not answer."""
    if services.prefect_api_url:
        _check_http(
            f"{services.prefect_api_url.rstrip('/')}/health", "Prefect API", "PREFECT_API_URL"
        )
    uri = services.mlflow_tracking_uri
    scheme = urlparse(uri).scheme
    if scheme in ("http", "https"):
        _check_http(f"{uri.rstrip('/')}/health", "MLflow tracking server", "MLFLOW_TRACKING_URI")
        _check_mlflow_login(uri.rstrip("/"))
    elif scheme == "sqlite":
        parent = Path(uri.removeprefix("sqlite:///")).parent
        if not parent.is_dir() or not os.access(parent, os.W_OK):
            raise InputError(
                f"MLflow tracking URI {uri!r}: directory {parent} does not exist or is not "
                "writable (set MLFLOW_TRACKING_URI)"
            )


def _check_http(url: str, what: str, variable: str) -> None:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            if response.status >= 400:
                raise ServiceError(f"{what} at {url} answered HTTP {response.status}")
    except (urllib.error.URLError, OSError, TimeoutError) as err:
        reason = getattr(err, "reason", err)
        raise ServiceError(
            f"cannot reach the {what} at {url.rsplit('/', 1)[0]} ({reason}); is it running? "
            f"(set by {variable})"
        ) from None


_joined: set[tuple[str, str]] = set()


def join_cluster(address: str | None) -> None:
    """Join the Ray cluster at ``address`` (nothing if None: stages start a local Ray) and
    check, once per process and home, that each of its nodes shares the home with this machine
    (:func:`stages.ray_runtime.check_shared_storage`): the stages hand each other files there.
    Raises :class:`stages.ray_runtime.RayClusterError` (a named error) otherwise."""
    if not address:
        return
    from stages.ray_runtime import check_shared_storage, init_ray

    home = robo_pipe_home()
    init_ray(address)
    if (address, str(home)) not in _joined:
        check_shared_storage(home)
        _joined.add((address, str(home)))


def _check_mlflow_login(uri: str) -> None:
    """Raise :class:`InputError` if the MLflow server at ``uri`` refuses this process's
    credentials (``MLFLOW_TRACKING_USERNAME``/``_PASSWORD`` for MLflow's basic auth, or
    ``MLFLOW_TRACKING_TOKEN``), as the MLflow client sends them: one read-only API call."""
    request = urllib.request.Request(f"{uri}/api/2.0/mlflow/experiments/search?max_results=1")
    user = os.environ.get("MLFLOW_TRACKING_USERNAME")
    token = os.environ.get("MLFLOW_TRACKING_TOKEN")
    if user:
        login = f"{user}:{os.environ.get('MLFLOW_TRACKING_PASSWORD', '')}".encode()
        request.add_header("Authorization", f"Basic {base64.b64encode(login).decode()}")
    elif token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10):
            return
    except urllib.error.HTTPError as err:
        if err.code == 401 and user:
            why = (
                f"refused the login of MLFLOW_TRACKING_USERNAME={user!r} (HTTP 401): check "
                "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
            )
        elif err.code == 401:
            why = (
                "needs a login (HTTP 401): set MLFLOW_TRACKING_USERNAME and "
                "MLFLOW_TRACKING_PASSWORD (or MLFLOW_TRACKING_TOKEN)"
            )
        elif err.code == 403:
            why = f"does not let {user or 'this client'} read experiments (HTTP 403)"
        else:
            return  # the server's own business; the MLflow client reports it if it matters
    except (urllib.error.URLError, OSError, TimeoutError):
        return  # /health answered a moment ago; a real outage shows in the first MLflow call
    raise InputError(f"the MLflow tracking server at {uri} {why}")  # the login is input


def healthy(url: str) -> bool:
    """True if ``url`` answers with a status below 400 within 2 s."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status < 400)
    except (urllib.error.URLError, OSError, TimeoutError):
        return False


def running_ui() -> dict[str, str] | None:
    """The servers a live ``robo-pipe ui`` started for this home, if it is still serving."""
    path = robo_pipe_home() / SERVICES_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        os.kill(int(state["pid"]), 0)
    except (ValueError, KeyError, OSError):
        return None
    if not _same_process(int(state["pid"]), state.get("owner_start")):
        return None  # its owner died and the pid went to another process
    if not healthy(f"{state['prefect_api_url']}/health"):
        return None
    return {k: str(v) for k, v in state.items() if not isinstance(v, list)}


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


def _same_process(pid: int, start: object) -> bool:
    """``pid`` is alive and is the process that started at ``start`` (no start recorded: any
    process with that pid)."""
    now = process_start(pid)
    return now is not None and (start is None or now == start)


def _cmdline(pid: int | str) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


_SERVER_MARKS = ("prefect server start", "mlflow server", "prefect.server.api.server:create_app")
"""What the command line of a server robo-pipe starts contains: ``ui``'s and ``serve``'s
Prefect server and MLflow UI, and the temporary Prefect server of a ``run`` (uvicorn)."""

_VERB_MARKS = ("pipelines.cli", "robo-pipe")


def _owned(pid: str) -> bool:
    """The parent of server ``pid`` is a live robo-pipe verb, or a server itself (MLflow's
    uvicorn worker): it is not an orphan."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # gone meanwhile: nothing to stop
    ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
    parent = _cmdline(ppid)
    return ppid > 1 and any(mark in parent for mark in (*_VERB_MARKS, *_SERVER_MARKS, "uvicorn"))


def stop_survivors(grace_s: float = 5.0) -> list[str]:
    """Find the servers of this home that outlived the verb that started them, stop them
    (their whole process group: SIGTERM, SIGKILL after ``grace_s``) and say so, one line each.

    Every ``ui``, ``serve`` and ``run`` calls it when it starts. A server outlives its verb
    only when the parent-death signal could not reach it (it is set on the server itself, so a
    worker it started survives a SIGKILL of the server), or when an older robo-pipe started it.
    Two ways to find them: the home's ``services.json`` whose owner is gone (pids, start times,
    process groups, ports), and any process whose command line is such a server's and whose
    environment names this home's Prefect folder, with no robo-pipe verb as its parent."""
    home = robo_pipe_home()
    lines: list[str] = []
    groups: dict[int, str] = {}
    path = home / SERVICES_FILE
    state: dict[str, Any] = {}
    with suppress(OSError, ValueError):
        state = json.loads(path.read_text())
    owner_pid = state.get("pid")
    if state and not (
        isinstance(owner_pid, int) and _same_process(owner_pid, state.get("owner_start"))
    ):
        owner = f"{state.get('owner', 'robo-pipe ui')} (pid {owner_pid}, gone)"
        for server in state.get("servers") or []:
            pid, pgid = int(server["pid"]), int(server["pgid"])
            if _same_process(pid, server.get("start")) or _signal_group(pgid, 0):
                groups[pgid] = (
                    f"found the {server['name']} (pid {pid}, port {server['port']}) left "
                    f"running by {owner}"
                )
        path.unlink(missing_ok=True)
    marker = f"PREFECT_HOME={home / 'prefect'}\0".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        cmdline = _cmdline(proc.name)
        if not any(mark in cmdline for mark in _SERVER_MARKS):
            continue
        try:
            if marker not in (proc / "environ").read_bytes() or _owned(proc.name):
                continue
            pgid = os.getpgid(int(proc.name))
        except OSError:
            continue
        if pgid not in groups and pgid != os.getpgid(0):
            what = "Prefect server" if "prefect" in cmdline else "MLflow UI"
            groups[pgid] = f"found a {what} (pid {proc.name}) of this home with no robo-pipe verb"
    for pgid in groups:
        _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(_signal_group(g, 0) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid, line in groups.items():
        killed = _signal_group(pgid, signal.SIGKILL)
        lines.append(f"{line}: stopped it{' (SIGKILL)' if killed else ''}")
    return lines


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        # As the servers bind: a port whose last server stopped a moment ago is free again,
        # though its closed connections linger (TIME_WAIT) for a minute.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


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
    """
    signal.signal(signal.SIGTERM, _raise_stopped)


def _raise_stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)


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
    except Stopped as stopped:
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


def interrupted_exit_code(interrupt: KeyboardInterrupt) -> int:
    """The exit code of a process that ``interrupt`` stopped: 128 + the signal's number, as a
    shell reports a process a signal ended (130 for Ctrl-C/SIGINT, 143 for SIGTERM)."""
    if isinstance(interrupt, ServerLost):
        return 3  # a service robo-pipe needs failed (docs/exit-codes.md)
    return 128 + (interrupt.signum if isinstance(interrupt, Stopped) else signal.SIGINT)


@contextmanager
def _interrupts_deferred() -> Iterator[None]:
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


def _signal_group(pgid: int, signum: int) -> bool:
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


def _with_parent_death(cmd: list[str]) -> list[str]:
    if not PDEATHSIG or not sys.platform.startswith("linux"):
        return cmd
    return [sys.executable, "-c", _PDEATHSIG_SHIM, str(os.getpid()), *cmd]


class _OwnSession:
    """The ``subprocess`` module as Prefect's temporary server module sees it during
    :func:`start_temporary_prefect_server`: its ``Popen`` starts the server in a session of its
    own, with the parent-death signal; every other name is the real module's."""

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    @staticmethod
    def Popen(args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        return subprocess.Popen(_with_parent_death(list(args)), start_new_session=True, **kwargs)


def start_temporary_prefect_server() -> None:
    """Without a Prefect server configured (``PREFECT_API_URL``), start the temporary one this
    process's flows report to now, in a session of its own: Prefect would start it on the first
    flow's call in this process's group, and Ctrl-C at a terminal signals the whole foreground
    group, so the server would die while the verb stops cleanly (a fleet rollout rolling back
    and recording its end). In its own session no terminal signal reaches it; it stops when
    this process exits (Prefect's ``atexit``) or dies (the parent-death signal). Swaps the
    ``subprocess`` name Prefect 3.8's ``prefect.server.api.server`` uses, for this one start
    (Prefect has no option for the server's session)."""
    if os.environ.get("PREFECT_API_URL"):
        return
    from prefect.server.api import server as prefect_server

    temporary = prefect_server.SubprocessASGIServer()  # the one Prefect's clients use
    if temporary.running:
        return
    plain = prefect_server.subprocess
    prefect_server.subprocess = _OwnSession()  # type: ignore[assignment]
    try:
        temporary.start()
    finally:
        prefect_server.subprocess = plain


class LocalServers:
    """The local Prefect server and MLflow UI of ``robo-pipe ui``, on 127.0.0.1.

    Both read the home's databases; their logs go to ``$ROBO_PIPE_HOME/prefect/server.log`` and
    ``$ROBO_PIPE_HOME/mlflow/server.log``. :meth:`stop` (or leaving the ``with`` block) stops
    both and removes ``services.json``.
    """

    def __init__(
        self, prefect_port: int = 4200, mlflow_port: int = 5000, owner: str = "robo-pipe ui"
    ) -> None:
        self.owner = owner
        """The verb that starts them: ``run``/``serve`` on this home name it when they use them."""
        self.prefect_port = prefect_port if _port_free(prefect_port) else free_port()
        self.mlflow_port = mlflow_port if _port_free(mlflow_port) else free_port()
        self.prefect_url = f"http://127.0.0.1:{self.prefect_port}"
        self.mlflow_url = f"http://127.0.0.1:{self.mlflow_port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, timeout_s: float = 90.0) -> None:
        """Start both servers (the Prefect database created first, once, under a lock) and
        wait until they answer."""
        from pipelines.stores import ensure_prefect_store

        bin_dir = Path(sys.executable).parent
        os.environ["PREFECT_HOME"] = str(home_dir("prefect"))
        # The Prefect database in a child process, under the home's lock. The MLflow server
        # creates its own store: opening it here would load MLflow into this process, whose
        # threads then kept it alive after SIGTERM.
        ensure_prefect_store()
        env = {
            **os.environ,
            "PREFECT_HOME": str(home_dir("prefect")),
            "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            # The UI calls the API by this URL; without it the browser cannot reach the server.
            "PREFECT_UI_API_URL": f"{self.prefect_url}/api",
            "MLFLOW_DISABLE_TELEMETRY": "true",
            # MLflow's job runner (GenAI evaluation jobs; robo-pipe runs none) is a dozen more
            # processes that start after the UI answers and take seconds to stop.
            "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": os.environ.get(
                "MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false"
            ),
        }
        # Concurrency leases in files under PREFECT_HOME, not in the server's memory: a
        # restarted server (serve restarts its own) keeps them, and frees expired ones.
        env["PREFECT_SERVER_CONCURRENCY_LEASE_STORAGE"] = (
            "prefect.server.concurrency.lease_storage.filesystem"
        )
        env.pop("PREFECT_API_URL", None)
        prefect_cmd = [str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1"]
        mlflow_cmd = [
            str(bin_dir / "mlflow"),
            "server",
            "--backend-store-uri",
            default_tracking_uri(),
            "--default-artifact-root",
            default_artifact_root(),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.mlflow_port),
        ]
        self._commands = [
            ([*prefect_cmd, "--port", str(self.prefect_port)], home_dir("prefect") / "server.log"),
            (mlflow_cmd, home_dir("mlflow") / "server.log"),
        ]
        self._env = env
        for index in range(len(self._commands)):
            self.processes.append(self._spawn(index))
        deadline = time.monotonic() + timeout_s
        for url, name in (
            (f"{self.prefect_url}/api/health", "Prefect"),
            (self.mlflow_url, "MLflow"),
        ):
            while not healthy(url):
                if any(p.poll() is not None for p in self.processes) or time.monotonic() > deadline:
                    self.stop()
                    raise ServiceError(
                        f"the {name} server did not start on {url}; see the logs under "
                        f"{robo_pipe_home()}/prefect and /mlflow"
                    )
                time.sleep(0.5)
        self._write_state()

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        """Start server ``index`` (0: Prefect, 1: MLflow) with the parent-death signal, in a
        session of its own (its pgid is its pid: :meth:`stop` signals the group). Call on the
        main thread: the signal fires when the thread that started it exits."""
        cmd, log = self._commands[index]
        # A Ctrl-C landing inside Popen would lose a started server (not yet in the list
        # that stop() stops): it is held back until the server is in the list.
        with log.open("ab") as out, _interrupts_deferred():
            return subprocess.Popen(
                _with_parent_death(cmd),
                env=self._env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _write_state(self) -> None:
        ports = (self.prefect_port, self.mlflow_port)
        names = ("Prefect server", "MLflow UI")
        state = {
            "pid": os.getpid(),
            "owner_start": process_start(os.getpid()),
            "owner": self.owner,
            "prefect_api_url": f"{self.prefect_url}/api",
            "prefect_ui": self.prefect_url,
            "mlflow_ui": self.mlflow_url,
            "servers": [
                {
                    "name": name,
                    "pid": proc.pid,
                    "start": process_start(proc.pid),
                    "pgid": proc.pid,
                    "port": port,
                }
                for name, proc, port in zip(names, self.processes, ports, strict=True)
            ],
        }
        (robo_pipe_home() / SERVICES_FILE).write_text(json.dumps(state, indent=1))

    def prefect_alive(self) -> bool:
        """The Prefect server process is still running (it may not answer yet)."""
        return bool(self.processes) and self.processes[0].poll() is None

    def restart_prefect(self) -> None:
        """Start the Prefect server again on the same port, after it died (wait for
        ``/api/health`` before using it); the old one's process group is killed first."""
        old = self.processes[0]
        _signal_group(old.pid, signal.SIGKILL)
        old.wait()
        self.processes[0] = self._spawn(0)
        self._write_state()

    def capture_note(self) -> str:
        """What the verb that started them says: later runs on this home report to them."""
        return (
            f"while this runs, robo-pipe run and serve on this home ({robo_pipe_home()}) report "
            "to these servers (set PREFECT_API_URL to send them elsewhere)"
        )

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop both servers and every process they started: SIGTERM to each server, which
        stops its own workers (signalled directly, uvicorn's supervisor would restart them),
        then SIGKILL to whatever is left of its process group after ``grace_s`` (SQLite keeps
        both stores intact). A second SIGTERM or Ctrl-C meanwhile takes effect once they are
        stopped: it must not leave them running."""
        with _interrupts_deferred():
            self._stop(grace_s)

    def _stop(self, grace_s: float) -> None:
        (robo_pipe_home() / SERVICES_FILE).unlink(missing_ok=True)
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        groups = [proc.pid for proc in self.processes]  # start_new_session: pgid == pid
        deadline = time.monotonic() + grace_s
        while any(_signal_group(pgid, 0) for pgid in groups) and time.monotonic() < deadline:
            for proc in self.processes:
                proc.poll()  # reap the servers themselves, or they linger as zombies
            time.sleep(0.1)
        for pgid in groups:
            _signal_group(pgid, signal.SIGKILL)
        for proc in self.processes:
            proc.wait()
        self.processes.clear()

    def __enter__(self) -> LocalServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
