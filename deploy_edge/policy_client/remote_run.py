"""The asynchronous control loop on a robot against a :class:`RemotePolicy`: inference on the
agent, actuation here, and what one run reports."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from deploy_edge.async_loop import AsyncControlLoop, Blend
from deploy_edge.policy_client.remote_policy import RemotePolicy
from deploy_edge.runtime import Tick, measure_inference
from robo_pipe.records import Record
from robots.interface import Robot


@dataclass
class RunSummary(Record):
    """What ``python -m deploy_edge.policy_client`` reports of one run (milliseconds)."""

    version: str
    ticks: int
    misses: int
    errors: int
    inference_p99_ms: float
    """The estimate the loop's trigger was derived from (measured or given)."""
    action_age_p50_ms: float | None
    action_age_p99_ms: float | None
    """Observation taken -> its action sent, over the ticks that sent a policy action."""
    first_error: str = ""


def probe_inference(policy: RemotePolicy, robot: Robot, instruction: str, count: int) -> float:
    """p99 (s) of ``count`` back-to-back inferences on the robot's current observation: the
    round trip the loop waits on (network, server queueing and engine together)."""
    return float(np.percentile(measure_inference(policy, robot, instruction, count, warmup=0), 99))


def run_remote(
    policy: RemotePolicy,
    robot: Robot,
    instruction: str,
    ticks: int,
    inference_s: float,
    margin_s: float = 0.02,
    blend: Blend = "linear",
) -> tuple[RunSummary, list[Tick]]:
    """``ticks`` periods of :class:`~deploy_edge.async_loop.AsyncControlLoop` with ``policy`` on
    ``robot`` (connected by the caller), paced to its control rate. ValueError (the arithmetic)
    when the served chunk cannot hold the rate with ``inference_s`` + ``margin_s``."""
    with AsyncControlLoop(
        policy, robot, instruction, inference_s=inference_s, margin_s=margin_s, blend=blend
    ) as loop:
        records = loop.run(ticks)
    ages = [t.action_age_s * 1000.0 for t in records if t.action_age_s is not None]
    errors = [t.error for t in records if t.error]
    summary = RunSummary(
        version=policy.version,
        ticks=len(records),
        misses=sum(t.missed for t in records),
        errors=len(errors),
        inference_p99_ms=inference_s * 1000.0,
        action_age_p50_ms=float(np.percentile(ages, 50)) if ages else None,
        action_age_p99_ms=float(np.percentile(ages, 99)) if ages else None,
        first_error=errors[0] if errors else "",
    )
    return summary, records
