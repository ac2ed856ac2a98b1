"""Starting Ray: a local instance by default, an existing cluster when given its address."""

from __future__ import annotations

import logging
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
        # The local instance listens on this machine's addresses, not on loopback only: Ray
        # 2.60 has no public setting for that (a node address of 127.0.0.1 is replaced by this
        # machine's), only a private switch we do not use. What guards it is Ray's token
        # authentication (RAY_AUTH_MODE), which a new local instance turns on by default.
        ray.init(
            # "local": a new instance even if `ray start` runs a cluster on this machine, which
            # ray.init() would otherwise join.
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
            # Ray's own notes on starting (its address, that token authentication is on) are
            # not the user's business on a local instance; its errors still show.
            logging_level=logging.ERROR,
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
