"""Playing a policy in simulation as a robot whose inference takes time (``evaluate.delay``).

Episodes count control ticks (one simulator step each, ``1 / control_hz`` s), so a delay is a
whole number of ticks and the play is deterministic (nothing sleeps). An inference of
``inference_ms`` plus ``margin_ms`` occupies ``d = ceil((inference + margin) / period)`` ticks
(:func:`deploy_edge.async_loop.inference_ticks`, the runtime's own arithmetic). Per environment:

    sync   (the runtime's ``ControlLoop`` when inference blocks the tick):
           queue empty at tick t -> infer on the observation of t; ticks t .. t+d-1 send the
           safe action (the robot holds while the engine works); from tick t+d the chunk's first
           ``execute`` actions, one per tick; then infer again
    async  (the runtime's asynchronous loop): the same :class:`~deploy_edge.async_loop.ChunkQueue`
           and trigger rule: at tick t, when no inference is in flight and ``remaining(t)`` is
           at most :func:`~deploy_edge.async_loop.trigger_threshold` (``d`` + the overlap the
           chunk leaves room for), infer on the observation of t; that chunk is added at tick
           t+d with obs tick t (aligned: its first d actions are past; blended into what is
           still planned for its ticks); a dry queue sends the safe action. As in the
           runtime, the queue plans joint targets: the chunk is anchored to the joints of its
           observation (:meth:`robots.spec.RobotSpec.chunk_targets`) and each tick sends the
           action toward its target from the joints measured then (``action_toward``)
    0 ms   today's evaluation exactly, in either mode: the first action of a chunk predicted
           every tick (receding horizon)

The safe action holds the arm (zero joint deltas) and keeps the gripper at its measured opening,
the rule of :func:`deploy_edge.runtime.hold_position`. An async configuration whose chunk cannot
cover the delay (:func:`deploy_edge.async_loop.async_shortfall`) is refused before any episode.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np

from deploy_edge.async_loop import (
    Blend,
    ChunkQueue,
    async_shortfall,
    committed_prefix,
    inference_ticks,
    prefix_ticks,
    trigger_threshold,
)
from robo_pipe.errors import RoboPipeError
from robo_pipe.records import Record
from robots.spec import RobotSpec
from sim_scenes.batched_env import BatchedEnv, BatchedObservation, StepResult
from stages.evaluate.config import DelayConfig
from stages.evaluate.policies import ActingPolicy


class DelayError(RoboPipeError, ValueError):
    """A delay that cannot be played: an async chunk too short for it, an unreadable latency
    report, a ``sync`` ``execute`` longer than the chunk, a baseline besides the delay."""


@dataclass
class DelayPlan(Record):
    """The resolved ``evaluate.delay`` of one evaluation (in its report)."""

    mode: str
    """``sync`` or ``async``."""
    inference_ms: float
    """The inference time played (given, or the latency report's p99)."""
    margin_ms: float
    period_ms: float
    """The control period (1000 / the robot's ``control_hz``)."""
    ticks: int
    """Ticks an inference occupies (0: no delay, today's evaluation)."""
    source: str = ""
    """Where ``inference_ms`` came from: ``given``, or the latency report's path and field."""
    blend: str = "linear"
    blend_ticks: int | None = None
    execute: int = 1
    chunk_len: int = 0
    """The policy's chunk length (filled in when the policy is loaded)."""
    trigger: int = 0
    """async: planned actions at or below which an inference starts
    (:func:`~deploy_edge.async_loop.trigger_threshold`; filled in with ``chunk_len``)."""

    def describe(self) -> str:
        """One line for people: mode, delay, ticks, and the chunk it plays."""
        how = (
            f"execute {self.execute} of each chunk"
            if self.mode == "sync"
            else f"inference at {self.trigger} planned actions, blend {self.blend}"
            + (f" over at most {self.blend_ticks} ticks" if self.blend_ticks is not None else "")
        )
        return (
            f"{self.mode}, inference {self.inference_ms:g} ms ({self.source}) + margin "
            f"{self.margin_ms:g} ms = {self.ticks} ticks of {self.period_ms:g} ms; chunk of "
            f"{self.chunk_len} actions, {how}"
        )


def delay_plan(config: DelayConfig, spec: RobotSpec) -> DelayPlan | None:
    """``config`` resolved for a robot of ``spec`` (its control period); None when it plays
    no delay (0 ms: today's evaluation).

    Raises:
        DelayError: an unreadable latency report, or one without an inference figure.
    """
    inference_ms, source = config.inference_ms, "given"
    if config.latency_report is not None:
        inference_ms = latency_report_p99_ms(Path(config.latency_report))
        source = f"inference p99 of {config.latency_report}"
    if inference_ms <= 0:
        return None
    period_s = 1.0 / spec.control_hz
    ticks = inference_ticks(inference_ms / 1000.0, config.margin_ms / 1000.0, period_s)
    return DelayPlan(
        mode=config.mode,
        inference_ms=inference_ms,
        margin_ms=config.margin_ms,
        period_ms=period_s * 1000.0,
        ticks=ticks,
        source=source,
        blend=config.blend,
        blend_ticks=config.blend_ticks,
        execute=config.execute,
    )


def latency_report_p99_ms(path: Path) -> float:
    """The inference p99 (ms) of a latency gate's ``latency_report.json``: its
    ``inference_p99_ms`` (an async gate's inference measured alone) where it has one, else its
    tick ``p99_ms`` (a sync gate's tick is the inference and its copies)."""
    from deploy_edge.latency_report import LatencyReport

    try:
        report = LatencyReport.from_json(json.loads(path.read_text()))
    except (OSError, ValueError) as err:
        raise DelayError(f"evaluate.delay.latency_report: {path}: {err}") from err
    return report.inference_ms


def check_plan(plan: DelayPlan, policy: ActingPolicy, path: str) -> DelayPlan:
    """``plan`` with the chunk length of ``policy`` (loaded from ``path``), refused when the
    policy cannot play it: an async chunk that cannot cover the delay (the runtime's rule and
    message), a sync ``execute`` longer than the chunk.

    Raises:
        DelayError: before any episode plays.
    """
    if plan.mode == "async":
        short = async_shortfall(
            policy.chunk_len,
            plan.period_ms / 1000.0,
            plan.inference_ms / 1000.0,
            plan.margin_ms / 1000.0,
        )
        if short:
            raise DelayError(f"{path}: evaluate.delay (async): {short}")
    elif plan.execute > policy.chunk_len:
        raise DelayError(
            f"{path}: evaluate.delay.execute {plan.execute} > the policy's chunk of "
            f"{policy.chunk_len} actions"
        )
    trigger = trigger_threshold(policy.chunk_len, plan.ticks, plan.blend_ticks)
    return DelayPlan(**{**plan.to_json(), "chunk_len": policy.chunk_len, "trigger": trigger})


@dataclass
class _Inflight:
    """An inference under way for one environment: its chunk (computed at once; it is the
    delay that is simulated), the tick of its observation and the tick it arrives."""

    chunk: np.ndarray
    obs_tick: int
    ready: int


class DelayedActor:
    """Per-environment planned actions of a policy whose inference takes ``plan.ticks`` ticks
    (see the module docstring): :meth:`act` is a :data:`sim_scenes.episodes.ActFn`,
    :meth:`on_step` (a :data:`~sim_scenes.episodes.StepFn`) starts a finished environment's
    next episode at tick 0 with nothing planned."""

    def __init__(self, policy: ActingPolicy, plan: DelayPlan, spec: RobotSpec) -> None:
        self.policy, self.plan, self.spec = policy, plan, spec
        self.tick: list[int] = []
        self.queues: list[ChunkQueue] = []
        """async: the planned actions."""
        self.sync: list[list[np.ndarray]] = []
        """sync: the chunk's actions still to send."""
        self.inflight: list[_Inflight | None] = []
        self.inference_s = 0.0
        """Wall time in ``predict_chunk`` (a shard's ``inference`` timing)."""

    def _start(self, n: int) -> None:
        self.tick = [0] * n
        self.queues = [self._queue() for _ in range(n)]
        self.sync = [[] for _ in range(n)]
        self.inflight = [None] * n

    def _queue(self) -> ChunkQueue:
        return ChunkQueue(cast(Blend, self.plan.blend), self.plan.blend_ticks)

    def act(self, env: BatchedEnv, obs: BatchedObservation) -> np.ndarray:
        """Actions ``(N, action_dim)`` for every environment's current tick."""
        n = env.num_envs
        if len(self.tick) != n:
            self._start(n)
        d = self.plan.ticks
        for e in range(n):  # chunks that arrive now first: the trigger sees what is planned
            self._receive(e)
        wants = [self._wants_inference(e) for e in range(n)]
        chunks = None
        if any(wants):  # one batched call; each env's chunk depends only on its observation
            start = time.perf_counter()
            chunks = self.policy.predict_chunk(obs, **self._committed(obs, wants))
            self.inference_s += time.perf_counter() - start
        actions = self._hold(obs.state)
        for e in range(n):
            now = self.tick[e]
            if wants[e] and chunks is not None:
                chunk = chunks[e]
                if self.plan.mode == "async":  # planned as joint targets, as the runtime does
                    chunk = self.spec.chunk_targets(chunk, obs.state[e])
                self.inflight[e] = _Inflight(chunk, now, now + d)
            action = self._due(e, now)
            if action is not None and self.plan.mode == "async":
                action = self.spec.action_toward(action, obs.state[e])
            if action is not None:  # else the safe action
                actions[e] = action
            self.tick[e] = now + 1
        return actions

    def _committed(self, obs: BatchedObservation, wants: list[bool]) -> dict[str, np.ndarray]:
        """A delay-conditioned policy's committed prefix for each environment that starts an
        inference now (async: what its queue plans for the ``d`` ticks the inference takes, as
        the runtime sends it; sync: nothing, the robot holds); no keywords for another
        policy."""
        if not (trained := prefix_ticks(self.policy)):
            return {}
        n, length = len(wants), self.policy.chunk_len
        prefix = np.zeros((n, length, self.spec.action.dim), np.float32)
        mask = np.zeros((n, length), np.float32)
        if self.plan.mode == "async":
            for e in (e for e in range(n) if wants[e]):
                prefix[e], mask[e] = committed_prefix(
                    self.queues[e], self.tick[e], self.plan.ticks, self.spec, obs.state[e],
                    length, trained,
                )  # fmt: skip
        return {"prefix": prefix, "prefix_mask": mask}

    def _receive(self, e: int) -> None:
        """Env ``e``'s chunk in flight, if it arrives at its current tick: async, into the
        queue, aligned to its observation's tick; sync, its first ``execute`` actions."""
        now, flight = self.tick[e], self.inflight[e]
        if flight is None or flight.ready > now:
            return
        if self.plan.mode == "async":
            self.queues[e].add(flight.chunk, flight.obs_tick, now)
        else:
            self.sync[e] = list(flight.chunk[: self.plan.execute])
        self.inflight[e] = None

    def _wants_inference(self, e: int) -> bool:
        """Whether env ``e`` starts an inference at its current tick: none in flight, and
        async: ``plan.trigger`` or fewer actions planned (the runtime's rule); sync: none
        left."""
        now = self.tick[e]
        if self.inflight[e] is not None:
            return False
        if self.plan.mode == "async":
            return self.queues[e].remaining(now) <= self.plan.trigger
        return not self.sync[e]

    def _due(self, e: int, now: int) -> np.ndarray | None:
        """What is planned for env ``e`` at tick ``now`` (async: a joint target; sync: an
        action); None: the safe action."""
        if self.plan.mode == "async":
            planned = self.queues[e].pop(now)
            return None if planned is None else planned.action
        return self.sync[e].pop(0) if self.sync[e] else None

    def _hold(self, state: np.ndarray) -> np.ndarray:
        """The safe action ``(N, action_dim)`` for states ``(N, state_dim)``: no motion (rp5: no
        joint motion, the gripper kept at its measured opening;
        :func:`deploy_edge.runtime.hold_position`, batched)."""
        return self.spec.hold_action(state)

    def on_step(
        self, slots: list[int], obs: BatchedObservation, actions: np.ndarray, result: StepResult
    ) -> None:
        """Environments whose episode ended start the next one at tick 0, nothing planned."""
        for e in result.final.env_ids:
            e = int(e)
            self.tick[e] = 0
            self.queues[e] = self._queue()
            self.sync[e] = []
            self.inflight[e] = None
