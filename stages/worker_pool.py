"""Ray actors doing a stage's work: a worker that dies is replaced and its work run again.

    pool    = N actors, each started by ``new_worker(slot)`` (collect, evaluate, RL rollouts)
    shards  = ``map_unordered``: every shard once, on whichever worker is idle, results as they
              finish (collect, evaluate)
    rounds  = ``call_each`` + ``gather``: one call on every worker, results in slot order (RL)
    a call that fails because its actor died (killed, out of memory, node lost): the actor is
    replaced in its slot and the call made again on the new one; the dead one's partial work
    never reached the caller, so nothing is counted twice. More than ``max_replacements``
    deaths re-raise the error (a shard that crashes every worker it meets).

Start Ray (:func:`stages.ray_runtime.init_ray`) before making a pool.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

MAX_REPLACEMENTS = 8
"""Worker replacements before a collection or evaluation gives up."""

Call = Callable[[Any], Any]
"""A remote method call on an actor, returning its ``ObjectRef`` (``lambda w: w.run.remote()``)."""


class WorkerPool:
    """``size`` actors from ``new_worker(slot)``; dead ones are replaced in their slot."""

    def __init__(self, new_worker: Callable[[int], Any], size: int, max_replacements: int) -> None:
        self.new_worker = new_worker
        self.max_replacements = max_replacements
        self.replacements = 0
        """Workers that died and were replaced so far."""
        self.workers = [new_worker(slot) for slot in range(size)]
        """The live actor handles, by slot."""

    def _replace(self, slot: int) -> bool:
        """Replace the dead worker in ``slot``; False (nothing done) when too many have died."""
        import ray

        if self.replacements >= self.max_replacements:
            return False
        self.replacements += 1
        ray.kill(self.workers[slot])
        self.workers[slot] = self.new_worker(slot)
        return True

    def call_each(self, call: Call) -> list[tuple[int, Call, Any]]:
        """Make ``call`` on every worker; hand the result to :meth:`gather`."""
        return [(slot, call, call(worker)) for slot, worker in enumerate(self.workers)]

    def gather(self, pending: list[tuple[int, Call, Any]]) -> list[Any]:
        """The results of :meth:`call_each`, in slot order (a dead worker's call made again)."""
        import ray
        from ray.exceptions import RayActorError

        results = []
        for slot, call, ref in pending:
            while True:
                try:
                    results.append(ray.get(ref))
                    break
                except RayActorError:
                    if not self._replace(slot):
                        raise
                    ref = call(self.workers[slot])
        return results

    def map_unordered(
        self, shards: Iterable[T], call: Callable[[Any, T], Any]
    ) -> Iterator[tuple[T, Any]]:
        """``(shard, result)`` for every shard once, as they finish."""
        import ray
        from ray.exceptions import RayActorError

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
            try:
                result = ray.get(done[0])
            except RayActorError:
                if not self._replace(slot):
                    raise
                idle.append(slot)
                pending.appendleft(shard)
                continue
            idle.append(slot)
            # The freed worker starts its next shard before the caller sees this result: a slow
            # consumer (or a test that kills that worker) then overlaps with real work.
            dispatch()
            yield shard, result

    def close(self) -> None:
        """Kill every worker."""
        import ray

        for worker in self.workers:
            ray.kill(worker)
