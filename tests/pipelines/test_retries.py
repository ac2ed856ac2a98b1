"""Which failed stages the pipeline retries: decided by exception type, never for a user's error."""

from __future__ import annotations

import ray.exceptions

from pipelines.run.stage_task import is_transient
from robo_pipe.errors import InputError
from stages.dataset.layout import DatasetError


class _LostNode(ray.exceptions.ActorDiedError):
    """A subclass of a retryable Ray error (Ray and its users add their own)."""


def test_dead_ray_workers_and_lost_connections_are_retried() -> None:
    assert is_transient(ray.exceptions.ActorDiedError())
    assert is_transient(_LostNode())
    assert is_transient(ray.exceptions.WorkerCrashedError())
    assert is_transient(ray.exceptions.NodeDiedError("node gone"))
    assert is_transient(ConnectionResetError("peer reset"))
    assert is_transient(TimeoutError("slow server"))


def test_a_users_error_is_never_retried() -> None:
    assert not is_transient(DatasetError("bad data"))
    assert not is_transient(InputError("bad config"))
    inside_ray = ray.exceptions.RayTaskError("collect_shard", "tb", DatasetError("bad shard"))
    assert not is_transient(inside_ray.as_instanceof_cause())
    assert not is_transient(ValueError("a bug"))
    assert not is_transient(None)
