"""The control loop: a policy on an engine driving a robot at its control rate.

    every tick (1 / control_hz s):
        observe                          images + state, copied out of the driver
        if the action queue is empty:    infer a chunk, queue its first ``execute`` actions
        action = queue.pop()
        if the tick overran its deadline, the engine failed, the observation holds a non-finite
        value (robots.limits.non_finite: NaN or inf; nothing is inferred from it) or the chunk an
        action outside the robot's limits (robots.limits.action_fault: NaN, inf, an arm delta
        beyond its joint's travel, a gripper opening far outside its range; nothing of it
        queued):
            act(safe action), drop the queue, count a miss (and the error, or the refusal)
        else:
            act(action)
        sleep until the next tick (when pacing)

The latency of a tick is measured from before ``observe`` to the moment the action is ready to
send: copies, tokenization, inference and post-processing included, the robot's own motion not.

A policy whose inference takes longer than one period cannot run that way: every tick that infers
misses. It runs asynchronously instead: :mod:`deploy_edge.async_loop` (:class:`AsyncControlLoop`,
its :class:`ChunkQueue`). Both loops share what is here: the policy they run
(:class:`ChunkPolicy`), the safe action, the record of one tick (:class:`Tick`), pacing.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType
from typing import Protocol, Self

import numpy as np

from robots.interface import Robot, RobotObservation
from robots.limits import action_fault, observation_fault

SafeAction = Callable[[RobotObservation], np.ndarray]
"""Maps the latest observation to the action that holds the robot safe."""


class ChunkPolicy(Protocol):
    """What the loop needs: ``infer(images, state, instructions) -> (B, chunk_len, A)``. A
    delay-conditioned policy also has ``prefix_ticks`` > 0, and its ``infer`` takes the
    committed prefix as keywords ``prefix`` and ``prefix_mask``
    (:func:`deploy_edge.async_loop.committed_prefix`); the asynchronous loop sends them only
    to such a policy (:func:`deploy_edge.async_loop.prefix_ticks`)."""

    chunk_len: int

    def infer(
        self, images: dict[str, np.ndarray], state: np.ndarray, instructions: list[str]
    ) -> np.ndarray:
        """Mean action chunk in robot units."""
        ...


def hold_position(robot: Robot) -> SafeAction:
    """Safe action: no motion (:meth:`RobotSpec.hold_action <robots.spec.RobotSpec.hold_action>`;
    rp5: no joint motion, the gripper kept where it is, as last measured finite: a NaN reading
    must not become a NaN command; before any, the home opening)."""
    spec = robot.spec
    last: np.ndarray | None = None  # the hold sent before: what a NaN reading falls back to

    def safe(obs: RobotObservation) -> np.ndarray:
        nonlocal last
        last = spec.hold_action(obs.state, last)
        return last

    return safe


@dataclass
class Tick:
    """One control period."""

    latency_s: float
    """Observation in -> action ready."""
    inferred: bool
    """Whether this tick ran the engine."""
    missed: bool
    """Deadline overrun, engine error or a refused value: the safe action was sent."""
    error: str = ""
    action_age_s: float | None = None
    """Observation the sent action was computed from taken -> action sent (None: safe action)."""
    seam_jump: float | None = None
    """At the first tick a new chunk commands: the largest change of the planned target the
    tick sends from the previous tick's (:meth:`~robots.spec.RobotSpec.chunk_targets`: joint
    positions in rad, the gripper opening in m), None elsewhere. Within one chunk the step is
    the planned motion; at a seam it adds the disagreement of the two plans."""
    inference_s: float | None = None
    """Duration of an inference that finished this tick."""
    refused: str = ""
    """A value this tick kept from the robot: a non-finite observation
    (:func:`robots.limits.non_finite`, e.g. ``state[2] = nan``) or an action outside the robot's
    limits (:func:`robots.limits.action_fault`); the tick is a miss; "" when none."""


def measure_inference(
    policy: ChunkPolicy, robot: Robot, instruction: str, runs: int, warmup: int = 1
) -> np.ndarray:
    """Seconds of ``runs`` inferences back to back on the (connected) robot's current
    observation, after ``warmup`` untimed ones (an engine's first run allocates)."""
    obs = robot.observe()
    images = {c: img[None] for c, img in obs.images.items()}
    for _ in range(warmup):
        policy.infer(images, obs.state[None], [instruction])
    seconds = []
    for _ in range(runs):
        start = time.perf_counter()
        policy.infer(images, obs.state[None], [instruction])
        seconds.append(time.perf_counter() - start)
    return np.array(seconds)


def run_ticks(tick: Callable[[], Tick], ticks: int, period: float | None) -> list[Tick]:
    """Call ``tick`` ``ticks`` times, each ``period`` seconds after the previous one started
    (None: back to back); the records, in order. The pacing of both control loops."""
    records = []
    next_tick = time.perf_counter()
    for _ in range(ticks):
        records.append(tick())
        if period is not None:
            next_tick += period
            time.sleep(max(0.0, next_tick - time.perf_counter()))
    return records


class ClosedOnExit:
    """A loop used as a context manager: its ``close()`` runs when the ``with`` block ends."""

    def close(self) -> None:
        """Release what the loop holds (its worker, its engine session)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ControlLoop(ClosedOnExit):
    """Runs ``policy`` on ``robot`` (see module docstring).

    Args:
        execute: actions of each chunk executed before inferring again (1..chunk_len).
        deadline_s: a tick whose latency exceeds this is a miss (default: the control period).
        pace: sleep to the control rate (off for measuring back-to-back).
    """

    def __init__(
        self,
        policy: ChunkPolicy,
        robot: Robot,
        instruction: str,
        execute: int = 1,
        deadline_s: float | None = None,
        safe_action: SafeAction | None = None,
        pace: bool = True,
    ) -> None:
        if not 1 <= execute <= policy.chunk_len:
            raise ValueError(f"execute must be in 1..{policy.chunk_len}, got {execute}")
        self.policy, self.robot, self.instruction = policy, robot, instruction
        self.execute = execute
        self.period = 1.0 / robot.spec.control_hz
        self.deadline_s = deadline_s if deadline_s is not None else self.period
        self.safe_action = safe_action or hold_position(robot)
        self.pace = pace
        self.queue: deque[np.ndarray] = deque()

    def tick(self) -> Tick:
        """One control period's work (without the pacing sleep)."""
        start = time.perf_counter()
        obs = self.robot.observe()
        inferred, error, action = False, "", None
        refused = obs.fault or observation_fault(obs.images, obs.state)
        try:
            if not refused and not self.queue:
                images = {c: img[None] for c, img in obs.images.items()}
                chunk = self.policy.infer(images, obs.state[None], [self.instruction])
                inferred = True
                refused = action_fault(self.robot.spec, "action", chunk[0, : self.execute])
                if not refused:
                    self.queue.extend(chunk[0, : self.execute])
            if not refused:
                action = self.queue.popleft()
        except Exception as err:  # any engine failure must leave the robot safe
            error = f"{type(err).__name__}: {err}"
        latency = time.perf_counter() - start
        missed = bool(error or refused) or latency > self.deadline_s
        if missed or action is None:
            self.queue.clear()  # stale after a late, failed or refused tick
            self.robot.act(self.safe_action(obs))
        else:
            self.robot.act(action)
        return Tick(latency, inferred, missed, error, refused=refused)

    def run(self, ticks: int) -> list[Tick]:
        """Run ``ticks`` control periods; returns their records."""
        return run_ticks(self.tick, ticks, self.period if self.pace else None)

    def close(self) -> None:
        """Nothing to stop (inference runs in the tick); for callers that hold either loop."""
