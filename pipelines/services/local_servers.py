"""The local servers of a home: the Prefect server and MLflow UI that ``robo-pipe ui`` (and
``serve``) start and record in ``services.json``, the temporary Prefect server of a run, the
servers a dead verb left running, and free ports on 127.0.0.1 for them."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from pipelines.home import default_artifact_root, default_tracking_uri, home_dir, robo_pipe_home
from pipelines.services.processes import (
    command_line,
    process_start,
    same_process,
    signal_group,
    with_parent_death,
)
from pipelines.services.settings import SERVICES_FILE, ServiceError, healthy
from pipelines.services.signals import interrupts_deferred

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
    parent = command_line(ppid)
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
        isinstance(owner_pid, int) and same_process(owner_pid, state.get("owner_start"))
    ):
        owner = f"{state.get('owner', 'robo-pipe ui')} (pid {owner_pid}, gone)"
        for server in state.get("servers") or []:
            pid, pgid = int(server["pid"]), int(server["pgid"])
            if same_process(pid, server.get("start")) or signal_group(pgid, 0):
                groups[pgid] = (
                    f"found the {server['name']} (pid {pid}, port {server['port']}) left "
                    f"running by {owner}"
                )
        path.unlink(missing_ok=True)
    marker = f"PREFECT_HOME={home / 'prefect'}\0".encode()
    for proc in Path("/proc").glob("[0-9]*"):
        cmdline = command_line(proc.name)
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
        signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while any(signal_group(g, 0) for g in groups) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pgid, line in groups.items():
        killed = signal_group(pgid, signal.SIGKILL)
        lines.append(f"{line}: stopped it{' (SIGKILL)' if killed else ''}")
    return lines


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_free(port: int) -> bool:
    """A server could bind ``port`` on 127.0.0.1 now."""
    with socket.socket() as sock:
        # As the servers bind: a port whose last server stopped a moment ago is free again,
        # though its closed connections linger (TIME_WAIT) for a minute.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


class _OwnSession:
    """The ``subprocess`` module as Prefect's temporary server module sees it during
    :func:`begin_temporary_prefect_server`: its ``Popen`` starts the server in a session of its
    own, with the parent-death signal, and sets ``launched``; every other name is the real
    module's."""

    def __init__(self, launched: threading.Event) -> None:
        self._launched = launched

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)

    def Popen(self, args: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        server = subprocess.Popen(with_parent_death(list(args)), start_new_session=True, **kwargs)
        self._launched.set()
        return server


def start_temporary_prefect_server() -> None:
    """Without a Prefect server configured (``PREFECT_API_URL``), start the temporary one this
    process's flows report to now, and return once it answers (how it is started:
    :func:`begin_temporary_prefect_server`)."""
    begin_temporary_prefect_server()()


def begin_temporary_prefect_server() -> Callable[[], None]:
    """Start the temporary Prefect server this process's flows report to, unless
    ``PREFECT_API_URL`` names one, and return a call that waits until it answers (and raises
    what its start raised).

    Returns once the server's process is launched (~2 s: Prefect's server module imported
    here first); that process then spends ~4 s importing and migrating its database, in which
    the caller imports what its flow needs (a tiny run took 3 s less). It is started by a thread
    that lives as long as this process: the parent-death signal fires when the *thread* that
    started the server exits.

    It starts in a session of its own: Prefect would start it on the first flow's call in this
    process's group, and Ctrl-C at a terminal signals the whole foreground group, so the server
    would die while the verb stops cleanly (a fleet rollout rolling back and recording its end).
    In its own session no terminal signal reaches it; it stops when this process exits
    (Prefect's ``atexit``) or dies (the parent-death signal). Swaps the ``subprocess`` name
    Prefect 3.8's ``prefect.server.api.server`` uses, for this one start (Prefect has no option
    for the server's session)."""
    if os.environ.get("PREFECT_API_URL"):
        return lambda: None
    launched, started = threading.Event(), threading.Event()
    failed: list[BaseException] = []

    def start() -> None:
        try:
            from prefect.server.api import server as prefect_server

            temporary = prefect_server.SubprocessASGIServer()  # the one Prefect's clients use
            if not temporary.running:
                plain = prefect_server.subprocess
                prefect_server.subprocess = _OwnSession(launched)  # type: ignore[assignment]
                try:
                    temporary.start()
                finally:
                    prefect_server.subprocess = plain
        except BaseException as error:  # handed to the caller's wait
            failed.append(error)
        finally:
            launched.set()  # (already, unless it failed before or was running)
            started.set()
        threading.Event().wait()  # the server's parent thread: lives until the process ends

    threading.Thread(target=start, name="prefect-temporary-server", daemon=True).start()
    launched.wait()

    def ready() -> None:
        started.wait()
        if failed:
            raise failed[0]

    return ready


PREFECT_PORT_VAR = "ROBO_PIPE_PREFECT_PORT"
MLFLOW_PORT_VAR = "ROBO_PIPE_MLFLOW_PORT"


def preferred_ports() -> tuple[int, int]:
    """The ports ``ui`` and ``serve`` try first for the Prefect server and the MLflow UI:
    ``$ROBO_PIPE_PREFECT_PORT`` and ``$ROBO_PIPE_MLFLOW_PORT``, else Prefect's and MLflow's own
    defaults (4200, 5000). Each falls back to the next free port when taken."""
    return (
        int(os.environ.get(PREFECT_PORT_VAR, "4200")),
        int(os.environ.get(MLFLOW_PORT_VAR, "5000")),
    )


class LocalServers:
    """The local Prefect server and MLflow UI of ``robo-pipe ui``, on 127.0.0.1.

    Both read the home's databases; their logs go to ``$ROBO_PIPE_HOME/prefect/server.log`` and
    ``$ROBO_PIPE_HOME/mlflow/server.log``. :meth:`stop` (or leaving the ``with`` block) stops
    both and removes ``services.json``.
    """

    def __init__(
        self,
        prefect_port: int | None = None,
        mlflow_port: int | None = None,
        owner: str = "robo-pipe ui",
    ) -> None:
        preferred = preferred_ports()
        prefect_port = preferred[0] if prefect_port is None else prefect_port
        mlflow_port = preferred[1] if mlflow_port is None else mlflow_port
        self.owner = owner
        """The verb that starts them: ``run``/``serve`` on this home name it when they use them."""
        self.prefect_port = prefect_port if port_free(prefect_port) else free_port()
        self.mlflow_port = mlflow_port if port_free(mlflow_port) else free_port()
        self.prefect_url = f"http://127.0.0.1:{self.prefect_port}"
        self.mlflow_url = f"http://127.0.0.1:{self.mlflow_port}"
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self, timeout_s: float = 90.0) -> None:
        """Start both servers (the Prefect database created first, once, under a lock) and
        wait until they answer."""
        from pipelines.stores import ensure_prefect_store, settle_home_store

        bin_dir = Path(sys.executable).parent
        os.environ["PREFECT_HOME"] = str(home_dir("prefect"))
        # The Prefect database in a child process, under the home's lock. The MLflow server
        # creates its own store: opening it here would load MLflow into this process, whose
        # threads then kept it alive after SIGTERM. A moved home's store is settled first
        # (plain SQLite), so the server never serves or writes the old place's artifacts.
        ensure_prefect_store()
        settle_home_store()
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
            # One worker process: MLflow's default of four loads MLflow four times (~4 s of
            # CPU each) for a UI one person reads; runs write to the store, not through it.
            "--workers",
            "1",
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
        with log.open("ab") as out, interrupts_deferred():
            return subprocess.Popen(
                with_parent_death(cmd),
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
        signal_group(old.pid, signal.SIGKILL)
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
        with interrupts_deferred():
            self._stop(grace_s)

    def _stop(self, grace_s: float) -> None:
        (robo_pipe_home() / SERVICES_FILE).unlink(missing_ok=True)
        for proc in self.processes:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        groups = [proc.pid for proc in self.processes]  # start_new_session: pgid == pid
        deadline = time.monotonic() + grace_s
        while any(signal_group(pgid, 0) for pgid in groups) and time.monotonic() < deadline:
            for proc in self.processes:
                proc.poll()  # reap the servers themselves, or they linger as zombies
            time.sleep(0.1)
        for pgid in groups:
            signal_group(pgid, signal.SIGKILL)
        for proc in self.processes:
            proc.wait()
        self.processes.clear()

    def __enter__(self) -> LocalServers:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
