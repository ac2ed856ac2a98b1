"""Starting Ray: a local instance by default, an existing cluster when given its address."""

from __future__ import annotations

import os

import ray


def init_ray(address: str | None = None, num_cpus: int | None = None) -> None:
    """Connect to Ray once per process.

    Args:
        address: ``None`` starts a local Ray on this machine; ``"auto"`` or ``"ray://host:port"``
            (or ``host:port``) joins an existing cluster, whose resources then apply.
        num_cpus: CPUs a local instance may use (default: all of this machine's).
    """
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        ray.init(
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
        )
