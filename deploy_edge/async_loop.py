"""The asynchronous control loop: actuation at the control rate, inference beside it.

A policy whose inference takes longer than one period cannot run that way: every tick that infers
misses. It runs asynchronously instead (:class:`AsyncControlLoop`): actuation at the control rate
takes planned actions from a :class:`ChunkQueue`, and inference runs beside it on the latest
observation; each chunk is time-aligned to the tick of the observation it was computed from and
blended into what the queue already plans (the rule is :class:`ChunkQueue`'s). The queue plans
joint *targets*, not actions: a chunk's relative actions are anchored to the joint positions of
its own observation (:meth:`robots.spec.RobotSpec.chunk_targets`) and each tick sends the action
toward its target from the joints measured then (:meth:`~robots.spec.RobotSpec.action_toward`),
because the arm moved while the chunk was computed and relative actions would add that motion a
second time (measured in simulation: the default VLA at 300 ms of inference keeps 97.5% with
anchoring, 19% without)::

    every tick (1 / control_hz s), counted by an integer tick t:
        if the background inference finished:   add its chunk to the queue at t (aligned, blended)
                                                 (it raised, or its chunk holds an action
                                                 outside the robot's limits, NaN or inf
                                                 included: drop the queue, record the error
                                                 or refusal)
        observe                                  (NaN or inf in it: act(safe action), count a
                                                 miss, infer nothing from it; the plan stays)
        if no inference is in flight and at most d + m actions are planned:
            start one on this observation (one worker thread; trigger_threshold: d ticks
            of inference, m of overlap to blend the seam over)
        target = queue.pop(t)
        if the queue was dry, the engine failed or the tick overran its deadline:
            act(safe action), count a miss
        else:
            act(action toward target from the measured joints)
        sleep until the next tick (when pacing)
"""

from __future__ import annotations

import math
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

import numpy as np

from deploy_edge.runtime import (
    ChunkPolicy,
    ClosedOnExit,
    SafeAction,
    Tick,
    hold_position,
    run_ticks,
)
from robots.interface import Robot
from robots.limits import action_fault, observation_fault
from robots.spec import RobotSpec

Blend = Literal["linear", "none"]
"""How :class:`ChunkQueue` merges a new chunk into the planned actions it overlaps."""


@dataclass(frozen=True)
class Planned:
    """One planned action: what to send at ``tick``, and the tick of the observation the newest
    chunk that shaped it was computed from."""

    tick: int
    action: np.ndarray
    obs_tick: int


def inference_ticks(inference_s: float, margin_s: float, period_s: float) -> int:
    """Ticks an inference occupies at the control rate: ``ceil((inference + margin) / period)``
    (at least 1). A chunk computed from the observation of tick ``t`` arrives for tick
    ``t + d``; its first ``d`` actions are past by then."""
    return max(1, math.ceil((inference_s + margin_s) / period_s - 1e-9))


def async_shortfall(chunk_len: int, period_s: float, inference_s: float, margin_s: float) -> str:
    """Why an asynchronous loop with chunks of ``chunk_len`` actions cannot hold its rate with
    inference taking ``inference_s`` (p99) plus ``margin_s``, with the arithmetic; "" when it
    can.

    The rule: an inference occupies ``d`` ticks (:func:`inference_ticks`); the next one starts
    on the observation of the tick the previous chunk arrives (the earliest the single engine is
    free), so one chunk must cover its own ``d`` stale ticks and the ``d`` of the next inference:
    ``chunk_len >= 2 d``. The loop triggers an inference when :func:`trigger_threshold`
    planned actions are left (``d`` or more)."""
    d = inference_ticks(inference_s, margin_s, period_s)
    if chunk_len >= 2 * d:
        return ""
    ms = period_s * 1000.0
    return (
        f"a chunk of {chunk_len} actions x {ms:g} ms = {chunk_len * ms:g} ms cannot hold "
        f"{1 / period_s:g} Hz: inference p99 {inference_s * 1000:.0f} ms + margin "
        f"{margin_s * 1000:.0f} ms = {d} ticks, and a chunk must cover its own {d} stale ticks "
        f"and the {d} of the next inference: {2 * d} actions ({2 * d * ms:g} ms)"
    )


def trigger_threshold(chunk_len: int, d: int, blend_ticks: int | None = None) -> int:
    """Planned actions at or below which an asynchronous loop starts an inference (when none is
    in flight): ``d + m``. ``d`` (:func:`inference_ticks`) covers the inference; ``m`` is the
    overlap the next chunk arrives into, the ticks :class:`ChunkQueue` blends the seam over, at
    most ``chunk_len - 2 d`` (what a chunk holds beyond the ``2 d`` :func:`async_shortfall`
    asks for). Default (``blend_ticks`` None): that most, so the next inference starts as soon
    as a chunk arrives: the freshest actions one engine can give (an action is ``d`` to
    ``2 d - 1`` ticks old). ``blend_ticks`` caps ``m``: fewer inferences, older actions. With
    ``m = 0`` a chunk arrives when the plan runs out, with nothing to blend: the seam is a
    jump whatever the blend."""
    room = max(0, chunk_len - 2 * d)
    return d + (room if blend_ticks is None else min(blend_ticks, room))


def committed_prefix(
    queue: ChunkQueue,
    now: int,
    d: int,
    spec: RobotSpec,
    state: np.ndarray,
    chunk_len: int,
    trained: int,
) -> tuple[np.ndarray, np.ndarray]:
    """What a delay-conditioned policy is told when an inference starts on the observation of
    tick ``now`` (state ``state``) and takes ``d`` ticks: the targets ``queue`` plans for ticks
    ``now .. now + d - 1``, which the robot executes whatever the new chunk says (it arrives for
    tick ``now + d``), as the first actions of a chunk from that observation
    (:meth:`~robots.spec.RobotSpec.chunk_from_targets`). Returns ``prefix`` float32
    ``(chunk_len, action_dim)`` (zeros past what is committed) and ``prefix_mask`` float32
    ``(chunk_len,)`` (1 for each committed action; a tick with nothing planned, the robot
    holding, ends the prefix). At most ``trained`` actions (the policy's ``prefix_ticks``): a
    longer prefix is one it never saw in training, and the first ``trained`` of it are the
    ones its chunk continues from (the blend joins the rest)."""
    planned = {p.tick: p.action for p in queue.planned}
    targets = []
    for tick in range(now, now + min(d, trained, chunk_len)):
        if tick not in planned:
            break
        targets.append(planned[tick])
    prefix = np.zeros((chunk_len, spec.action.dim), np.float32)
    mask = np.zeros(chunk_len, np.float32)
    if targets:
        prefix[: len(targets)] = spec.chunk_from_targets(np.stack(targets), state)
        mask[: len(targets)] = 1.0
    return prefix, mask


def prefix_ticks(policy: object) -> int:
    """The committed actions ``policy`` takes (its ``prefix_ticks``; 0: a policy that is not
    delay-conditioned, or one that does not say, which is then never sent a prefix)."""
    return int(getattr(policy, "prefix_ticks", 0) or 0)


class ChunkQueue:
    """The actions an asynchronous policy has planned for the coming ticks.

    Ticks are the control loop's integer counter. A chunk of ``L`` actions computed from the
    observation taken at tick ``obs_tick`` plans ticks ``obs_tick .. obs_tick + L - 1`` (action
    ``i`` for tick ``obs_tick + i``, as the synchronous loop would have sent it).
    :meth:`add` at tick ``now``:

    - **alignment**: actions for ticks before ``now`` are dropped (their time has passed while
      the chunk was being computed);
    - **blend** (``linear``, the default): over the first ``m`` ticks that both the queue and the
      new chunk plan (``m`` = the overlap, at most ``blend_ticks``), the action sent is
      ``(1 - w_j) * planned + w_j * new`` with ``w_j = (j + 1) / (m + 1)``, ``j = 0 .. m-1``: the
      commanded trajectory crosses over from the old plan to the new one in ``m + 1`` equal steps
      instead of jumping at the seam; after the overlap (and beyond the old plan) the new chunk's
      own actions. ``none``: the new chunk replaces the plan outright (naive switching, for
      comparison);
    - ticks the new chunk does not reach keep nothing of the old plan (it is older).
    """

    def __init__(self, blend: Blend = "linear", blend_ticks: int | None = None) -> None:
        if blend not in ("linear", "none"):
            raise ValueError(f"blend must be 'linear' or 'none', got {blend!r}")
        if blend_ticks is not None and blend_ticks < 0:
            raise ValueError(f"blend_ticks must be >= 0, got {blend_ticks}")
        self.blend, self.blend_ticks = blend, blend_ticks
        self.planned: deque[Planned] = deque()

    def add(self, chunk: np.ndarray, obs_tick: int, now: int) -> int:
        """Merge ``chunk`` (``(L, action_dim)``, robot units) computed from the observation of
        ``obs_tick`` into the plan at tick ``now``; returns how many of its actions were already
        past (skipped)."""
        self._drop_before(now)
        skipped = max(0, now - obs_tick)
        new = [
            Planned(obs_tick + i, np.asarray(a, dtype=np.float32), obs_tick)
            for i, a in enumerate(chunk)
            if obs_tick + i >= now
        ]
        old = {p.tick: p.action for p in self.planned}
        overlap = sum(p.tick in old for p in new)
        m = overlap if self.blend_ticks is None else min(overlap, self.blend_ticks)
        if self.blend == "none":
            m = 0
        merged = []
        for j, p in enumerate(new):
            if j < m and p.tick in old:
                w = (j + 1) / (m + 1)
                p = Planned(
                    p.tick, ((1 - w) * old[p.tick] + w * p.action).astype(np.float32), p.obs_tick
                )
            merged.append(p)
        self.planned = deque(merged)
        return skipped

    def pop(self, now: int) -> Planned | None:
        """The action planned for tick ``now`` (None: the queue is dry); drops what is past."""
        self._drop_before(now)
        if self.planned and self.planned[0].tick == now:
            return self.planned.popleft()
        return None

    def remaining(self, now: int) -> int:
        """Planned actions for ticks ``now`` and later."""
        return sum(p.tick >= now for p in self.planned)

    def clear(self) -> None:
        """Forget the plan (after an engine failure: what it planned is not trusted)."""
        self.planned.clear()

    def _drop_before(self, now: int) -> None:
        while self.planned and self.planned[0].tick < now:
            self.planned.popleft()


@dataclass(frozen=True)
class _Chunk:
    """What the inference worker hands back: a chunk as joint targets ``(L, A)``
    (:meth:`~robots.spec.RobotSpec.chunk_targets`), the tick of the observation it was computed
    from, how long the inference took (s), and why the policy's chunk is refused
    (:func:`~robots.limits.action_fault`; "" when it is not)."""

    actions: np.ndarray
    obs_tick: int
    inference_s: float
    refused: str = ""


class AsyncControlLoop(ClosedOnExit):
    """Runs ``policy`` on ``robot`` with inference off the control tick (module docstring).

    Actuation never waits on the engine: one background worker thread infers on the latest
    observation when at most :func:`trigger_threshold` actions are planned (``d`` =
    :func:`inference_ticks` to cover the inference, plus the overlap the seam is blended over),
    and the chunk joins the :class:`ChunkQueue` at the start of the first tick after it
    finished, aligned to the observation's tick and blended (``blend``, ``blend_ticks``).

    Misses: a dry queue, an engine failure or a chunk holding an action outside the robot's
    limits (:func:`~robots.limits.action_fault`: NaN, inf, a delta beyond its joint's travel; the
    queue is dropped: what it planned is not trusted), an observation holding NaN or inf
    (nothing is inferred from it; the plan stays) and a tick whose own latency exceeds
    ``deadline_s`` all
    send the safe action; a refused value is the tick's ``refused``. The
    ticks before the first chunk ever arrives (about ``d`` after the start) send the safe action
    too, but are not misses: the robot has not started moving, nothing was late. A late tick
    keeps the plan: it is indexed by tick, so it is still right for the ticks that follow.
    ``tick()`` never raises for an engine failure: a policy whose ``infer`` raises (a remote one
    whose socket dropped) leaves the robot on its safe action at the next tick.

    Ticks are counted, not timed: ``d`` ticks stand for ``d`` periods only when the loop is
    paced, so ``pace=False`` is for tests that step it by hand.

    Args:
        inference_s: the inference time (s, a p99 estimate) ``d`` is derived from.
        margin_s: added to ``inference_s`` (s): the queue's copy, scheduling, the network.
        blend, blend_ticks: :class:`ChunkQueue`'s seam rule; ``blend_ticks`` also caps the
            overlap :func:`trigger_threshold` plans for (default: as much as the chunk allows;
            0: none, the seam a jump).
        deadline_s: a tick whose latency exceeds this is a miss (default: the control period).
        pace: sleep to the control rate.

    Raises:
        ValueError: the chunk cannot hold the rate (:func:`async_shortfall`'s arithmetic).
    """

    def __init__(
        self,
        policy: ChunkPolicy,
        robot: Robot,
        instruction: str,
        *,
        inference_s: float,
        margin_s: float = 0.02,
        blend: Blend = "linear",
        blend_ticks: int | None = None,
        deadline_s: float | None = None,
        safe_action: SafeAction | None = None,
        pace: bool = True,
    ) -> None:
        self.period = 1.0 / robot.spec.control_hz
        shortfall = async_shortfall(policy.chunk_len, self.period, inference_s, margin_s)
        if shortfall:
            raise ValueError(shortfall)
        self.policy, self.robot, self.instruction = policy, robot, instruction
        self.inference_ticks = inference_ticks(inference_s, margin_s, self.period)
        """``d``: the ticks an inference occupies."""
        self.lead = trigger_threshold(policy.chunk_len, self.inference_ticks, blend_ticks)
        """An inference starts when at most this many actions are planned."""
        self.deadline_s = deadline_s if deadline_s is not None else self.period
        self.safe_action = safe_action or hold_position(robot)
        self.pace = pace
        self.queue = ChunkQueue(blend, blend_ticks)
        self.now = 0
        """The tick counter: the tick the next ``tick()`` runs."""
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="inference")
        self._pending: Future[_Chunk] | None = None
        self._observed_at: dict[int, float] = {}  # tick -> perf_counter() at its observation
        self._last: Planned | None = None  # the planned target the previous tick sent
        self._started = False  # a chunk has arrived: from then on, a dry queue is a miss

    def _infer(
        self,
        images: dict[str, np.ndarray],
        state: np.ndarray,
        obs_tick: int,
        committed: dict[str, np.ndarray],
    ) -> _Chunk:
        start = time.perf_counter()
        chunk = self.policy.infer(images, state, [self.instruction], **committed)
        seconds = time.perf_counter() - start
        refused = action_fault(self.robot.spec, "action", chunk[0])
        # Planned as joint targets from the observation's own state: the robot moves while
        # the chunk is computed, and its relative actions would add that motion twice.
        targets = self.robot.spec.chunk_targets(np.asarray(chunk[0], np.float32), state[0])
        return _Chunk(targets, obs_tick, seconds, refused)

    def tick(self) -> Tick:
        """One control period's work (without the pacing sleep)."""
        start = time.perf_counter()
        now, self.now = self.now, self.now + 1
        error, refused, inference_s = "", "", None
        if self._pending is not None and self._pending.done():
            done, self._pending = self._pending, None
            try:
                chunk = done.result()
                inference_s, refused = chunk.inference_s, chunk.refused
                if not refused:
                    self.queue.add(chunk.actions, chunk.obs_tick, now)
                    self._started = True
            except Exception as err:  # any engine failure must leave the robot safe
                error = f"{type(err).__name__}: {err}"
            if error or refused:  # what the queue planned is not trusted either
                self.queue.clear()
        obs = self.robot.observe()
        self._observed_at[now] = start
        refused = refused or obs.fault or observation_fault(obs.images, obs.state)
        inferred = not refused and self._pending is None and self.queue.remaining(now) <= self.lead
        if inferred:
            # Copies: the driver may reuse its buffers while the worker reads them.
            images = {c: img[None].copy() for c, img in obs.images.items()}
            committed = {}
            if prefix_ticks(self.policy):  # what the robot executes while this one infers
                prefix, mask = committed_prefix(
                    self.queue, now, self.inference_ticks, self.robot.spec, obs.state,
                    self.policy.chunk_len, prefix_ticks(self.policy),
                )  # fmt: skip
                committed = {"prefix": prefix[None], "prefix_mask": mask[None]}
            self._pending = self._worker.submit(
                self._infer, images, obs.state[None].copy(), now, committed
            )
        planned = None if error or refused else self.queue.pop(now)
        latency = time.perf_counter() - start
        self._forget_before(now - self.policy.chunk_len)
        if error or refused or planned is None or latency > self.deadline_s:
            self._last = None
            self.robot.act(self.safe_action(obs))
            missed = bool(error or refused) or self._started or latency > self.deadline_s
            return Tick(latency, inferred, missed, error, inference_s=inference_s, refused=refused)
        seam = None
        if self._last is not None and self._last.obs_tick != planned.obs_tick:
            seam = float(np.max(np.abs(planned.action - self._last.action)))
        self._last = planned
        action = self.robot.spec.action_toward(planned.action, obs.state)
        age = time.perf_counter() - self._observed_at[planned.obs_tick]
        self.robot.act(action)
        return Tick(latency, inferred, False, "", age, seam, inference_s)

    def run(self, ticks: int) -> list[Tick]:
        """Run ``ticks`` control periods; returns their records."""
        return run_ticks(self.tick, ticks, self.period if self.pace else None)

    def close(self) -> None:
        """Stop the inference worker (waits for an inference in flight; idempotent)."""
        self._worker.shutdown(wait=True, cancel_futures=True)
        self._pending = None

    def _forget_before(self, tick: int) -> None:
        # No planned action is older than one chunk: their observation times are not needed.
        for old in [t for t in self._observed_at if t < tick]:
            del self._observed_at[old]
