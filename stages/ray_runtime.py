"""Starting Ray: a local instance by default, an existing cluster when given its address."""

from __future__ import annotations

import os
import socket

from robo_pipe.errors import RoboPipeError


class RayClusterError(RoboPipeError, ValueError):
    """The Ray cluster named by ``--ray-address`` cannot be reached, or cannot provide the
    resources the config asks for."""


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to Ray once per process.

    Args:
        address: ``None`` starts a local Ray on this machine; ``"auto"`` or ``"ray://host:port"``
            (or ``host:port``) joins an existing cluster, whose resources then apply.
        num_cpus: CPUs a local instance may use (default: all of this machine's).
    """
    if not address:
        # A local instance talks to itself on loopback only: without this Ray advertises the
        # machine's network interface even when nothing outside will ever join. Ray reads the
        # variable when it is first imported, so this module imports Ray only here.
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    if ray.is_initialized():
        return
    if address:
        _check_reachable(address)  # ray.init would retry an unreachable address for minutes
        try:
            ray.init(address=address, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise RayClusterError(
                f"cannot join the Ray cluster at {address!r}: {err}. Is `ray start --head` "
                "running there, and reachable from this machine?"
            ) from err
    else:
        ray.init(
            # "local": a new instance even if `ray start` runs a cluster on this machine, which
            # ray.init() would otherwise join.
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
        )


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
