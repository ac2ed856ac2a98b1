"""Ray actors doing a stage's work; Ray restarts a worker that dies and runs its call again.

    actors  = ``restartable(cls, ...)``: Ray's own ``max_restarts`` (the stage's
              ``max_worker_restarts``) and ``max_task_retries=-1``: a worker process that dies
              (killed, out of memory) is started again from its constructor's arguments and the
              call it was running is run again there, as often as restarts are left
    pool    = N actors (collect, evaluate, RL rollouts) and what Ray does not say itself:
              which worker died and what was redone (a line for ``on_status``), and a named
              error when Ray gives up on one
    shards  = ``map_unordered``: every shard once, on whichever worker is idle, results as they
              finish (collect, evaluate)
    rounds  = ``call_each`` + ``gather``: one call on every worker, results in slot order (RL)

A pool notices a restart by the process id: every result a worker returns carries the ``pid``
of the process that made it, so a result from a new pid means the old process died after that
worker's previous result, and this call ran (again) on its successor. A call's work counts
once because its result exists once: a dead process's partial work never reached the caller
(collect commits a shard atomically; evaluation returns its episodes).

``ray.util.ActorPool`` is not used: it does not say which actor returned a result (what
noticing a restart needs) nor which one Ray gave up on, and it has no one-call-per-worker round
for RL.

Start Ray (:func:`stages.ray_runtime.init_ray`) before making a pool.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from robo_pipe.errors import ServiceFailure
from robo_pipe.locks import StatusFn


class FromProcess(Protocol):
    """What a pool's worker call returns: it names the process that made it."""

    @property
    def pid(self) -> int:
        """The worker process's id."""
        ...


T = TypeVar("T")


@dataclass(frozen=True)
class Ready:
    """A worker's answer to a call with no result of its own."""

    pid: int
    restarted: bool = False
    """This process is a restart: an earlier one of the same worker died."""


class PoolWorker:
    """Base of the classes a :class:`WorkerPool` runs as actors."""

    def ready(self) -> Ready:
        """Which process this worker is, and whether Ray restarted it (its first one died)."""
        import ray

        return Ready(os.getpid(), ray.get_runtime_context().was_current_actor_reconstructed)


class WorkersDiedError(ServiceFailure, RuntimeError):
    """A stage's worker died more often than Ray may restart it (``max_worker_restarts``)."""


def restartable(cls: type, num_cpus: float, max_restarts: int) -> Any:
    """``cls`` as a Ray actor class whose actors Ray restarts up to ``max_restarts`` times each,
    running the call that was in flight again on the new process (``max_task_retries=-1``:
    as long as restarts are left; the restart limit is the one bound)."""
    import ray

    return ray.remote(num_cpus=num_cpus, max_restarts=max_restarts, max_task_retries=-1)(cls)


class WorkerPool:
    """``size`` restartable actors from ``new_worker(slot)``, made with :func:`restartable`.

    ``role`` names a worker in lines and errors (``collect worker``); ``limit`` is the config
    field that sets ``max_restarts`` (``collect.max_worker_restarts``). Each restart noticed
    is said on ``on_status``.
    """

    def __init__(
        self,
        new_worker: Callable[[int], Any],
        size: int,
        role: str,
        limit: str,
        max_restarts: int,
        on_status: StatusFn | None = None,
    ) -> None:
        self.role, self.limit, self.max_restarts = role, limit, max_restarts
        self.on_status = on_status
        self.workers = [new_worker(slot) for slot in range(size)]
        """The actor handles, by slot (a restarted worker keeps its handle)."""
        self.restarts = 0
        """Worker restarts noticed so far."""
        self._deaths = [0] * size
        # Asked now, answered before the slot's first result is looked at; a process that died
        # before answering answers from its successor, which knows it was restarted.
        self._first: list[Any] = [worker.ready.remote() for worker in self.workers]
        self.pids: list[int | None] = [None] * size
        """Each worker's process as of its latest result (None before its first)."""

    def _check(self, slot: int, result: FromProcess, work: str) -> None:
        """Say so if ``result`` came from another process than the slot's previous one."""
        import ray

        if self.pids[slot] is None:
            first: Ready = ray.get(self._first[slot])
            self.pids[slot] = first.pid
            if first.restarted:  # died in its constructor: no call of ours was under way
                self._died(
                    slot, f"{self._name(slot)} died while starting; restarted as pid {first.pid}"
                )
        if result.pid != self.pids[slot]:
            self._died(
                slot,
                f"{self._name(slot)} (pid {self.pids[slot]}) died; restarted as pid "
                f"{result.pid}, which redid {work}",
            )
        self.pids[slot] = result.pid

    def _name(self, slot: int) -> str:
        """How lines name the worker in ``slot``: ``collect worker 2 of 4`` (from 1)."""
        return f"{self.role} {slot + 1} of {len(self.workers)}"

    def _died(self, slot: int, line: str) -> None:
        self.restarts += 1
        self._deaths[slot] += 1
        if self.on_status:
            self.on_status(line)

    def _gave_up(self, slot: int, work: str, err: Exception) -> WorkersDiedError:
        """The error for a worker Ray stopped restarting while it was doing ``work``."""
        deaths = self.max_restarts + 1  # Ray restarted it exactly max_restarts times
        others = sum(self._deaths) - self._deaths[slot]
        return WorkersDiedError(
            f"{self._name(slot)} died {deaths} time{'s' * (deaths > 1)}, the last time on "
            f"{work}: Ray restarts a worker at most {self.limit} = {self.max_restarts} times"
            f" ({deaths + others} worker deaths in all). Raise {self.limit} to allow more, or "
            f"find what kills them (out of memory?); {type(err).__name__}: "
            f"{str(err).splitlines()[0]}"
        )

    def _get(self, slot: int, ref: Any, work: str) -> Any:
        """``ray.get(ref)`` of a call on ``slot``: Ray giving up on the worker is named."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        try:
            result = ray.get(ref)
        except RayActorError as err:
            # An exception raised in the worker's own code (RayTaskError), or one in its
            # constructor (its first call), is not a death: the caller sees it as it is.
            if isinstance(err, RayTaskError) or err.actor_init_failed:
                raise
            raise self._gave_up(slot, work, err) from err
        self._check(slot, result, work)
        return result

    def call_each(self, call: Callable[[Any], Any]) -> list[Any]:
        """Make ``call`` (``lambda w: w.method.remote(...)``) on every worker; hand the result
        to :meth:`gather`."""
        return [call(worker) for worker in self.workers]

    def gather(self, pending: list[Any], work: str) -> list[Any]:
        """The results of :meth:`call_each`, in slot order; ``work`` says what each call did
        (``its rollout of iteration 3``), for the line about a restart.

        Raises:
            WorkersDiedError: a worker died more often than Ray may restart it.
        """
        return [self._get(slot, ref, work) for slot, ref in enumerate(pending)]

    def map_unordered(
        self, shards: Iterable[T], call: Callable[[Any, T], Any], describe: Callable[[T], str]
    ) -> Iterator[tuple[T, Any]]:
        """``(shard, result)`` for every shard once, as they finish; ``describe(shard)`` names
        a shard in lines and errors (``shard 40-80``).

        Raises:
            WorkersDiedError: a worker died more often than Ray may restart it.
        """
        import ray

        pending = deque(shards)
        idle = list(range(len(self.workers)))
        running: dict[Any, tuple[int, T]] = {}

        def dispatch() -> None:
            while idle and pending:
                slot, shard = idle.pop(), pending.popleft()
                running[call(self.workers[slot], shard)] = (slot, shard)

        while pending or running:
            dispatch()
            done, _ = ray.wait(list(running), num_returns=1)
            slot, shard = running.pop(done[0])
            result = self._get(slot, done[0], describe(shard))
            idle.append(slot)
            # The freed worker starts its next shard before the caller sees this result: a slow
            # consumer (or a test that kills that worker) then overlaps with real work.
            dispatch()
            yield shard, result

    def close(self) -> None:
        """Kill every worker (for good: no restart)."""
        import ray

        for worker in self.workers:
            ray.kill(worker)
