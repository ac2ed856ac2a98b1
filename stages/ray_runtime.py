"""Starting Ray: a local instance by default, an existing cluster when given its address.

Joining a cluster checks, before anything runs there:

- that the cluster answers and accepts this machine (:func:`init_ray`): a cluster with token
  authentication on (``RAY_AUTH_MODE=token`` where it was started, or a token in
  ``~/.ray/auth_token`` there) refuses a driver without its token; Ray itself would retry
  that for 20 s and then report a crashed cluster, so one gRPC call asks first and names the
  cause;
- that every node sees the files the stages hand each other (:func:`check_shared_storage`):
  collection workers commit shards, training workers write checkpoints and evaluation
  workers read the exported policy, all under one folder the driver also reads.
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from robo_pipe.errors import RoboPipeError

PROBE_DIR = ".cluster-probe"
"""Under the checked folder: the files of one storage check (removed after it)."""


class RayClusterError(RoboPipeError, ValueError):
    """The Ray cluster named by ``--ray-address`` cannot be reached, does not accept this
    machine, cannot provide the resources the config asks for, or has a node that does not see
    the shared storage."""


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to Ray once per process.

    Args:
        address: ``None`` starts a local Ray on this machine; ``"auto"`` or ``"ray://host:port"``
            (or ``host:port``) joins an existing cluster, whose resources then apply.
        num_cpus: CPUs a local instance may use (default: all of this machine's).
    """
    import ray

    if ray.is_initialized():
        return
    if address:
        _check_reachable(address)  # ray.init would retry an unreachable address for minutes
        _check_token(address)
        try:
            with signal_handlers_kept():
                ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RayClusterError(
                f"cannot join the Ray cluster at {address!r}: {err}. Is `ray start --head` "
                "running there, and reachable from this machine?"
            ) from err
    else:
        # The local instance listens on this machine's addresses, not on loopback only: Ray
        # 2.60 has no public setting for that (a node address of 127.0.0.1 is replaced by this
        # machine's), only a private switch we do not use. What guards it is Ray's token
        # authentication (RAY_AUTH_MODE), which a new local instance turns on by default.
        with signal_handlers_kept():
            ray.init(
                # "local": a new instance even if `ray start` runs a cluster on this machine,
                # which ray.init() would otherwise join.
                address="local",
                num_cpus=num_cpus or os.cpu_count(),
                include_dashboard=False,
                log_to_driver=False,
                # Ray's own notes on starting (its address, that token authentication is on)
                # are not the user's business on a local instance; its errors still show.
                logging_level=logging.ERROR,
            )


@contextmanager
def signal_handlers_kept() -> Iterator[None]:
    """Keep this process's SIGTERM and SIGINT handlers through ``ray.init`` (main thread only:
    elsewhere Python sets no handler).

    ``ray.init`` in a driver replaces them three ways: a Python SIGTERM handler that exits 15
    (``sys.exit(signum)``), the local node's, which kills Ray's processes and exits 1, and, when
    its core worker starts, the C++ failure-signal handler (Abseil's), which prints
    ``*** SIGTERM received at time=…`` with a stack dump and ends the process with SIGABRT
    (exit 134) before any ``finally`` runs. The verb's own handler (a stop that runs every
    ``finally`` and exits 143, :func:`pipelines.services.signals.stop_on_sigterm`, or the
    Prefect flow engine's while a flow runs) must stay the one that acts. The Python handlers
    are not installed (Ray's ``set_sigterm_handler`` does nothing during the call: Ray 2.60 has
    no setting for that); the C++ one is replaced when the call returns (setting a Python
    handler installs Python's own C handler again). Ray still stops its processes: at the
    interpreter's exit (its ``atexit``), or, if this process dies hard, by the parent-death
    signal Ray gives the processes a driver starts."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    import ray._private.utils as ray_utils

    kept = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    install = ray_utils.set_sigterm_handler
    ray_utils.set_sigterm_handler = lambda handler: None
    try:
        yield
    finally:
        ray_utils.set_sigterm_handler = install
        for signum, handler in kept.items():
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(signum, handler)


def _check_reachable(address: str) -> None:
    """Raise :class:`RayClusterError` if ``host:port`` (or ``ray://host:port``) does not accept
    a TCP connection within 5 s; ``auto`` is left to Ray."""
    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit():
        return
    try:
        with socket.create_connection((host, int(port)), timeout=5):
            pass
    except OSError as err:
        raise RayClusterError(
            f"cannot join the Ray cluster at {address!r}: nothing answers at {host}:{port} "
            f"({err.strerror or err}). Is `ray start --head` running there?"
        ) from None


def _check_token(address: str) -> None:
    """Raise :class:`RayClusterError` if the cluster at ``host:port`` refuses this driver's
    token (or its lack of one): one GetClusterId call to its GCS, the call ``ray.init`` makes
    first. ``auto`` and ``ray://`` (Ray Client) addresses are left to Ray."""
    import grpc

    # Ray's own token loader (env RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token) and
    # GCS stubs: compiled modules that Ray's type stubs do not describe.
    from ray._raylet import AuthenticationTokenLoader  # type: ignore[attr-defined]
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    if address == "auto" or address.startswith("ray://"):
        return
    token_mode = os.environ.get("RAY_AUTH_MODE", "").lower() == "token"
    token = ""
    if token_mode:
        loader = AuthenticationTokenLoader.instance()
        loader.reset_cache()
        if not loader.has_token(ignore_auth_mode=True):
            raise RayClusterError(
                f"cannot join the Ray cluster at {address!r}: RAY_AUTH_MODE=token but this "
                "machine has no token. Copy the cluster's token (`ray get-auth-token` on its "
                "head node) into ~/.ray/auth_token, or set RAY_AUTH_TOKEN"
            )
        token = loader.get_raw_token(ignore_auth_mode=True)
    metadata = [("authorization", f"Bearer {token}")] if token else None
    with grpc.insecure_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        try:
            request = gcs_service_pb2.GetClusterIdRequest()  # type: ignore[attr-defined]
            stub.GetClusterId(request, timeout=10, metadata=metadata)
        except grpc.RpcError as err:
            if err.code() != grpc.StatusCode.UNAUTHENTICATED:
                return  # anything else: ray.init reports it
            if token_mode:
                raise RayClusterError(
                    f"cannot join the Ray cluster at {address!r}: it refused this machine's "
                    "token. Use the cluster's token (`ray get-auth-token` on its head node) in "
                    "~/.ray/auth_token or RAY_AUTH_TOKEN"
                ) from None
            raise RayClusterError(
                f"cannot join the Ray cluster at {address!r}: it has token authentication on. "
                "Set RAY_AUTH_MODE=token and give this machine the cluster's token "
                "(`ray get-auth-token` on its head node) in ~/.ray/auth_token or RAY_AUTH_TOKEN"
            ) from None


def node_id() -> str:
    """The Ray node this process runs on (a worker's, or the driver's); ``""`` outside Ray."""
    import ray

    if not ray.is_initialized():
        return ""
    return str(ray.get_runtime_context().get_node_id())


@dataclass(frozen=True)
class NodeView:
    """What one node saw of the shared storage (:func:`check_shared_storage`)."""

    node_id: str
    host: str
    error: str
    """Empty if the node read the driver's file and wrote its own; else why not."""


def _probe_node(folder: str, secret: str) -> NodeView:
    """On one node: read the driver's file under ``folder``, then write this node's own."""
    import ray

    node = ray.get_runtime_context().get_node_id()
    path = Path(folder)
    try:
        seen = (path / "driver").read_text()
        if seen != secret:
            return NodeView(node, socket.gethostname(), f"{path / 'driver'} holds another file")
        (path / f"node-{node}").write_text(secret)
    except OSError as err:
        return NodeView(node, socket.gethostname(), f"{err.strerror or err}: {err.filename}")
    return NodeView(node, socket.gethostname(), "")


def check_shared_storage(folder: Path, timeout_s: float = 120.0) -> list[str]:
    """Check that every node of the cluster Ray is connected to sees ``folder`` as this
    process does: the driver writes a file there, a task on each alive node reads it and
    writes one of its own, and the driver reads those back.

    Returns the node ids checked. Raises :class:`RayClusterError` naming the node, its host and
    the path it could not use, or a node that did not answer within ``timeout_s``.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    probe = folder / PROBE_DIR / secrets.token_hex(8)
    secret = secrets.token_hex(16)
    probe.mkdir(parents=True)
    try:
        (probe / "driver").write_text(secret)
        nodes = [n for n in ray.nodes() if n["Alive"]]
        # No CPU: a node busy with another job's work still answers.
        task = ray.remote(num_cpus=0, max_retries=0)(_probe_node)
        refs = [
            task.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
            ).remote(str(probe), secret)
            for n in nodes
        ]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        for ref, node in zip(refs, nodes, strict=True):
            where = f"node {node['NodeID'][:12]} ({node['NodeManagerAddress']})"
            if ref in pending:
                ray.cancel(ref, force=True)
                raise RayClusterError(
                    f"{where} did not answer the shared-storage check within {timeout_s:.0f} s"
                )
            view: NodeView = ray.get(ref)
            written = probe / f"node-{view.node_id}"
            if not view.error and not _holds(written, secret):
                view = NodeView(view.node_id, view.host, f"the driver cannot read {written}")
            if view.error:
                raise RayClusterError(
                    f"{where}, host {view.host}, does not share {folder} with this machine: "
                    f"{view.error}. Every node must see the same ROBO_PIPE_HOME at the same "
                    "path (e.g. an NFS mount); see docs/scale-out.md"
                )
        return [str(n["NodeID"]) for n in nodes]
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _holds(path: Path, secret: str) -> bool:
    try:
        return path.read_text() == secret
    except OSError:
        return False
