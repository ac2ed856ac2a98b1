"""Finite or nothing (issue 55): a NaN or inf in an observation's state or image, or in the
actions a policy emits, and an action outside the robot's limits (an arm delta beyond its
joint's travel, a gripper opening more than one travel outside its range), never reach the
robot. Each boundary refuses it (:func:`robots.limits.non_finite`,
:func:`robots.limits.action_fault`): the policy server answers an error frame naming the field
and serves the next observation; both control loops send the safe action and count the tick a
miss with the reason; the latency gate fails a policy that emits one; the export refuses a
graph that emits a non-finite value for its finite parity inputs. A delta above the rate bound
(``±max_joint_delta``) but inside the joint's travel is clipped, not refused.

Through the real pieces: the tiny ONNX export (a state of 3e38, finite, makes it emit NaN), a
running agent process and a WebSocket client, the simulated robot recording what it is sent."""

from __future__ import annotations

import math
import re
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from deploy_edge.async_loop import AsyncControlLoop
from deploy_edge.exported import ExportedPolicy
from deploy_edge.latency import run_gate
from deploy_edge.policy_client.remote_policy import PolicyServerError, RemotePolicy
from deploy_edge.runtime import ControlLoop, Tick
from deploy_edge.targets import load_target
from deploy_edge.wire import ChunkFrame, ObservationFrame, encode_image, frame_data, frame_text
from robots.interface import RobotObservation
from robots.rp5 import RP5
from robots.spec import RobotSpec
from stages.export import export
from stages.export.parity import ExportError
from stages.policy.checkpoint import new_policy, save_policy
from tests.deploy_edge.narrow_robot import NARROW
from tests.deploy_edge.test_deployer import base_state, keys, releases
from tests.deploy_edge.test_policy_server import (
    TOKEN,
    batch,
    observation,
    start_agent,
    stop_agent,
)
from tests.deploy_edge.test_runtime import RecordingRobot
from tests.stages.tiny_models import TINY_POLICY

__all__ = ["base_state", "keys", "releases"]  # fixtures this module's tests use

INSTRUCTION = "touch the red cube"
OVERFLOW = 3e38
"""A finite float32 state value the tiny export turns into NaN actions (its activations
overflow): a policy that emits NaN for a finite input."""

FAULTS = [
    ("state", math.nan, "state[2] = nan"),
    ("state", math.inf, "state[2] = inf"),
    ("image", math.nan, "image_scene[5, 7, 1] = nan"),
    ("image", -math.inf, "image_scene[5, 7, 1] = -inf"),
    ("action", math.nan, "action[0, 3] = nan"),
    ("action", math.inf, "action[0, 3] = inf"),
    ("action", -4.5, "action[0, 3] = -4.5 rad: beyond joint wrist_pitch's travel of 4 rad"),
    (
        "gripper",
        0.2,
        "action[0, 5] = 0.2 m: a gripper opening outside [-0.06, 0.12] m (its range 0..0.06 m, "
        "one travel either side)",
    ),
]
"""Where the unsafe value is (``action``: the first action's wrist_pitch delta, ``gripper``: its
gripper opening), the value, and the reason a refusing tick records."""
ACTIONS = {"action": 3, "gripper": 5}
"""The fault fields in the policy's actions, and the action component each sets."""


class FaultyRobot(RecordingRobot):
    """The recording simulated robot whose ``fault_on``-th observation (1-based; 0: none)
    holds ``value``: in the state (joint 2), or in the scene image (a driver handing out a
    float image, pixel (5, 7) green)."""

    def __init__(self, spec: RobotSpec, field: str, value: float, fault_on: int) -> None:
        super().__init__(spec)
        self.field, self.value, self.fault_on, self.observations = field, value, fault_on, 0

    def observe(self) -> RobotObservation:
        obs = super().observe()
        self.observations += 1
        if self.observations != self.fault_on:
            return obs
        if self.field == "state":
            state = obs.state.copy()
            state[2] = self.value
            return RobotObservation(obs.images, state, obs.timestamp)
        image = obs.images["scene"].astype(np.float32)
        image[5, 7, 1] = self.value
        return RobotObservation({**obs.images, "scene": image}, obs.state, obs.timestamp)


class EmittingExport(ExportedPolicy):
    """The real export whose chunks of the inferences numbered in ``emitting`` (1-based) hold
    ``value`` at the first action's ``component`` (3: wrist_pitch's delta)."""

    def __init__(self, export_dir: Path, value: float, emitting: range, component: int = 3) -> None:
        super().__init__(export_dir)
        self.value, self.emitting, self.component, self.calls = value, emitting, component, 0

    def infer(
        self,
        images: dict[str, np.ndarray],
        state: np.ndarray,
        instructions: list[str],
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        self.calls += 1
        chunk = super().infer(images, state, instructions, prefix, prefix_mask)
        if self.calls in self.emitting:
            chunk[:, 0, self.component] = self.value
        return chunk


def faulty_pair(
    rp5: RobotSpec, export_dir: Path, field: str, value: float, observation: int, chunks: range
) -> tuple[FaultyRobot, EmittingExport]:
    """The robot and policy of a fault case: the ``observation``-th observation holds
    ``value`` (a state or image fault), or the chunks numbered in ``chunks`` (an action or
    gripper fault)."""
    robot = FaultyRobot(rp5, field, value, observation if field not in ACTIONS else 0)
    emitting = chunks if field in ACTIONS else range(0)
    return robot, EmittingExport(export_dir, value, emitting, ACTIONS.get(field, 3))


def assert_nothing_unsafe_sent(robot: FaultyRobot, ticks: list[Tick]) -> None:
    """Every action sent is finite, its arm deltas inside each joint's travel and its gripper
    opening inside ``[low - travel, high + travel]`` (checked here, not by the rule's code)."""
    assert len(robot.sent) == len(ticks), "every tick sends one action"
    spec = robot.spec
    travel = np.array([j.high - j.low for j in spec.arm])
    opening = spec.action.high[5] - spec.action.low[5]

    def unsafe(a: np.ndarray) -> bool:
        if not np.isfinite(a).all() or np.any(np.abs(a[:5]) > travel):
            return True
        return not spec.action.low[5] - opening <= a[5] <= spec.action.high[5] + opening

    bad = [k for k, a in enumerate(robot.sent) if unsafe(a)]
    assert bad == [], f"unsafe actions reached the robot at ticks {bad}"


@pytest.mark.parametrize(("field", "value", "reason"), FAULTS)
def test_the_sync_loop_sends_the_safe_action_for_an_unsafe_value(
    rp5: RobotSpec, export_dir: Path, field: str, value: float, reason: str
) -> None:
    """One inference per tick (``execute=1``): the 3rd observation, or the 3rd chunk, holds the
    value. That tick sends the safe action and is a miss naming it; the others are not."""
    robot, policy = faulty_pair(rp5, export_dir, field, value, 3, range(3, 100))
    robot.connect()
    try:
        loop = ControlLoop(policy, robot, INSTRUCTION, execute=1, deadline_s=30.0, pace=False)
        ticks = loop.run(6)
    finally:
        robot.stop()
    assert_nothing_unsafe_sent(robot, ticks)
    # A policy that keeps emitting the value is refused at every tick from the 3rd on.
    expected = ["", "", reason, *([reason] * 3 if field in ACTIONS else [""] * 3)]
    assert [t.refused for t in ticks] == expected
    assert [t.missed for t in ticks] == [bool(t.refused) for t in ticks]
    assert all(t.error == "" for t in ticks), "a refusal is not an engine error"
    assert np.all(robot.sent[2][:5] == 0.0), "the safe action: no joint motion"


@pytest.mark.parametrize(("field", "value", "reason"), FAULTS)
def test_the_async_loop_sends_the_safe_action_for_an_unsafe_value(
    rp5: RobotSpec, export_dir: Path, field: str, value: float, reason: str
) -> None:
    """Paced at 10 Hz (inference ~1 ms: d = 1, a new chunk every tick or two): the 8th
    observation, or the 3rd chunk, holds the value. The tick that meets it sends the safe
    action and is a miss naming it; with a refused chunk the plan is dropped and the loop
    recovers with the next one."""
    robot, policy = faulty_pair(rp5, export_dir, field, value, 8, range(3, 4))
    robot.connect()
    try:
        with AsyncControlLoop(
            policy, robot, INSTRUCTION, inference_s=0.01, deadline_s=30.0
        ) as loop:
            ticks = loop.run(16)
    finally:
        robot.stop()
    assert_nothing_unsafe_sent(robot, ticks)
    refused = [k for k, t in enumerate(ticks) if t.refused]
    assert len(refused) == 1 and ticks[refused[0]].refused == reason, [t.refused for t in ticks]
    k = refused[0]
    if field not in ACTIONS:
        assert k == 7, "the tick of the faulty observation"
    assert ticks[k].missed and ticks[k].error == "" and ticks[k].action_age_s is None
    assert np.all(robot.sent[k][:5] == 0.0), "the safe action: no joint motion"
    assert any(t.action_age_s is not None for t in ticks[k + 1 :]), "it recovers"


@pytest.mark.parametrize("loop", ["sync", "async"])
def test_a_delta_above_the_rate_bound_inside_its_joints_travel_is_clipped_not_refused(
    rp5: RobotSpec, export_dir: Path, loop: str
) -> None:
    """Every chunk asks wrist_pitch for 1.0 rad in one step: 12 times the 0.08 rad rate bound,
    a quarter of its 4 rad travel. No tick is refused or missed; the joint moves at most the
    bound per tick (the sync loop sends the delta and the driver clips it; the async loop sends
    the clipped step toward its planned target)."""
    robot, policy = faulty_pair(rp5, export_dir, "action", 1.0, 0, range(1, 1000))
    robot.connect()
    try:
        if loop == "sync":
            ticks = ControlLoop(
                policy, robot, INSTRUCTION, execute=1, deadline_s=30.0, pace=False
            ).run(6)
        else:
            with AsyncControlLoop(
                policy, robot, INSTRUCTION, inference_s=0.01, deadline_s=30.0
            ) as async_loop:
                ticks = async_loop.run(12)
    finally:
        robot.stop()
    assert [t.refused for t in ticks] == [""] * len(ticks)
    assert not any(t.missed for t in ticks)
    bound = rp5.authored.max_joint_delta
    moving = [a for a in robot.sent if a[3] != 0.0]
    assert moving, "the policy's delta was sent"
    if loop == "sync":
        assert all(a[3] == pytest.approx(1.0) for a in moving), "sent as asked: the driver clips"
    else:
        assert all(abs(a[3]) <= bound + 1e-6 for a in moving), "sent clipped to the bound"
    steps = np.abs(np.diff([s[3] for s in robot.observed]))
    assert steps.max() <= bound + 1e-3, f"wrist_pitch moved {steps.max():.3f} rad in one tick"


def test_the_gate_refuses_a_policy_that_emits_nan_whatever_misses_it_allows(
    rp5: RobotSpec, export_dir: Path
) -> None:
    """A policy whose every chunk holds NaN, on a target that allows 100 misses: every
    measured tick is a miss, and the gate fails naming the refused value."""
    target = load_target("local-cpu").model_copy(update={"allowed_misses": 100})
    report = run_gate(
        export_dir,
        RecordingRobot(rp5),
        INSTRUCTION,
        target,
        steps=10,
        warmup=2,
        budget_ms=10_000.0,
        pace=False,
        policy=EmittingExport(export_dir, math.nan, range(1, 1000)),
    )
    assert report.misses == 10 and not report.passed
    assert report.reasons == ["10 ticks refused an unsafe value (first: action[0, 3] = nan)"]


def test_the_policy_server_refuses_a_non_finite_state_or_chunk_and_serves_the_next(
    base_state: Path, tmp_path: Path
) -> None:
    """A raw WebSocket client (a robot's own client may send JSON's NaN and Infinity) on a
    running agent: a state holding NaN or inf is answered by an error frame naming the field,
    a finite state the policy turns into NaN by one naming its actions; each time the same
    socket serves the next good observation. The robot-side client refuses a NaN image before
    sending (the wire's uint8 pixels cannot carry it)."""
    from websockets.sync.client import connect

    agent = start_agent(base_state, tmp_path)
    try:
        policy = RemotePolicy(agent["url"], TOKEN, timeout_s=10)
        obs = observation(policy)
        images = {camera: encode_image(image) for camera, image in obs.images.items()}
        good = [float(x) for x in obs.state]
        with connect(policy.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as socket:
            assert frame_data(socket.recv(timeout=10))["version"] == "tiny:1"
            ids = iter(range(100))

            def ask(state: list[float]) -> ChunkFrame:
                frame = ObservationFrame(next(ids), time.time(), INSTRUCTION, state, images)
                socket.send(frame_text(frame))
                return ChunkFrame.from_json(frame_data(socket.recv(timeout=10)))

            assert ask(good).error == ""
            for value, shown in ((math.nan, "nan"), (math.inf, "inf"), (-math.inf, "-inf")):
                answer = ask([*good[:2], value, *good[3:]])
                assert answer.error == f"refused: state[2] = {shown}" and answer.actions == []
                served = ask(good)
                assert served.error == "" and len(served.actions) == 3, "the socket still serves"
            answer = ask([OVERFLOW] * len(good))
            assert answer.error.startswith("refused: the policy's actions[0, 0] = nan")
            assert answer.actions == []
            assert ask(good).error == ""
        # The robot-side client: the server's refusal, and its own for an image.
        images_batch, state = batch(obs)
        with pytest.raises(PolicyServerError, match=r"refused: the policy's actions\[0, 0\]"):
            policy.infer(images_batch, np.full_like(state, OVERFLOW), [INSTRUCTION])
        bad_image = images_batch["scene"].astype(np.float32)
        bad_image[0, 1, 2, 0] = math.nan
        with pytest.raises(ValueError, match=r"refused before sending: image_scene\[1, 2, 0\]"):
            policy.infer({"scene": bad_image}, state, [INSTRUCTION])
        assert policy.infer(images_batch, state, [INSTRUCTION]).shape == (1, 3, 6)
        policy.close()
    finally:
        stop_agent(agent)


def test_the_policy_server_refuses_actions_beyond_its_robots_joint_travel(
    base_state: Path, tmp_path: Path
) -> None:
    """An agent whose device drives a robot with a 0.2 rad wrist_pitch travel (its driver's
    spec; release 1 active, the tiny export, which asks that joint for about -0.78 rad): a good
    observation over a real WebSocket is answered by an error frame naming the action, the
    joint and its travel, and the same socket answers the next; the robot-side client raises
    the server's refusal."""
    from websockets.sync.client import connect

    agent = start_agent(base_state, tmp_path, driver=NARROW)
    beyond = r"actions\[0, 3\] = -0\.\d+ rad: beyond joint wrist_pitch's travel of 0\.2 rad"
    try:
        policy = RemotePolicy(agent["url"], TOKEN, timeout_s=10)
        obs = observation(policy)
        images = {camera: encode_image(image) for camera, image in obs.images.items()}
        with connect(policy.url, additional_headers={"Authorization": f"Bearer {TOKEN}"}) as socket:
            assert frame_data(socket.recv(timeout=10))["version"] == "tiny:1"
            for frame_id in range(2):
                frame = ObservationFrame(
                    frame_id, time.time(), INSTRUCTION, [float(x) for x in obs.state], images
                )
                socket.send(frame_text(frame))
                answer = ChunkFrame.from_json(frame_data(socket.recv(timeout=10)))
                assert answer.id == frame_id and answer.actions == []
                assert re.fullmatch(f"refused: the policy's {beyond}", answer.error), answer.error
        with pytest.raises(PolicyServerError, match=beyond):
            policy.infer(*batch(obs), [INSTRUCTION])
        policy.close()
    finally:
        stop_agent(agent)


def test_export_refuses_a_graph_that_emits_nan_for_its_finite_parity_inputs(
    tmp_path: Path,
) -> None:
    """A checkpoint with one NaN weight: torch and ONNX Runtime agree (NaN both sides shows
    no deviation), but the ONNX outputs on the finite reference inputs hold NaN: refused, and
    nothing is written."""
    torch.manual_seed(0)
    policy, _ = new_policy(TINY_POLICY, ["scene"], 32, "rp5", 6, 6)
    with torch.no_grad():
        next(iter(policy.parameters())).view(-1)[0] = math.nan
    save_policy(policy, tmp_path / "ckpt", None)
    with pytest.raises(ExportError, match=r"emits a non-finite value for finite inputs .*= nan"):
        export(tmp_path / "ckpt", tmp_path / "export", RP5.control_hz)
    assert not (tmp_path / "export").exists()
