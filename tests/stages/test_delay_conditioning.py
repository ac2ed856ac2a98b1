"""Delay-conditioned policies (issue 52, point 3): trained on simulated inference delays, told
the committed prefix (the actions the robot executes while the next chunk is computed) by the
export, the asynchronous runtime and the simulated delay alike."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import torch

from deploy_edge.async_loop import AsyncControlLoop, ChunkQueue, committed_prefix
from deploy_edge.exported import ExportedPolicy
from robots.spec import get_robot
from sim_scenes.batched_env import BatchedObservation
from stages.dataset.layout import DatasetRef
from stages.finetune.data import simulated_delays
from tests.deploy_edge.test_runtime import RecordingRobot
from tests.stages.tiny_models import TINY_POLICY, rp5_normalizer

CHUNK = 6
PREFIX = 3
RP5 = get_robot("rp5")


def test_simulated_delays_commit_the_first_actions_of_each_chunk() -> None:
    rng = np.random.default_rng(0)
    actions = rng.normal(size=(400, CHUNK, 2)).astype(np.float32)
    valid = np.ones((400, CHUNK), bool)
    valid[:50, 2:] = False  # chunks that run past their episode's end after 2 actions
    given = simulated_delays({"actions": actions, "action_valid": valid}, rng, PREFIX)
    mask, prefix = given["prefix_mask"], given["prefix"]
    lengths = mask.sum(1).astype(int)
    # A prefix: ones then zeros, d in 0..PREFIX, never past the episode's end.
    assert np.array_equal(mask, (np.arange(CHUNK)[None] < lengths[:, None]).astype(np.float32))
    assert set(lengths) == set(range(PREFIX + 1)) and lengths[:50].max() <= 2
    assert np.array_equal(prefix, np.where(mask[..., None] > 0, actions, 0.0))


@pytest.mark.parametrize("robot", ["rp5", "sawyer"])
def test_committed_targets_become_the_actions_of_a_chunk_from_the_new_observation(
    robot: str,
) -> None:
    spec = get_robot(robot)
    rng = np.random.default_rng(1)
    low, high = np.asarray(spec.action.low), np.asarray(spec.action.high)
    chunk = rng.uniform(low, high, size=(CHUNK, spec.action.dim)).astype(np.float32)
    state = rng.normal(size=len(spec.state_names)).astype(np.float32)
    targets = spec.chunk_targets(chunk, state)
    assert np.allclose(spec.chunk_from_targets(targets, state), chunk, atol=1e-4)  # float32


def test_the_prefix_is_what_the_queue_plans_for_the_ticks_the_inference_takes() -> None:
    rng = np.random.default_rng(2)
    chunk = rng.uniform(-0.01, 0.01, size=(CHUNK, RP5.action.dim)).astype(np.float32)
    state = np.zeros(len(RP5.state_names), np.float32)
    queue = ChunkQueue()
    queue.add(RP5.chunk_targets(chunk, state), obs_tick=0, now=0)
    moved = state + 0.002  # the arm moved by tick 2, where the next inference starts
    prefix, mask = committed_prefix(queue, 2, 3, RP5, moved, CHUNK, trained=4)
    planned = RP5.chunk_targets(chunk, state)[2:5]
    assert mask.tolist() == [1, 1, 1, 0, 0, 0]
    assert np.allclose(prefix[:3], RP5.chunk_from_targets(planned, moved), atol=1e-6)
    assert not prefix[3:].any()
    # Planned only up to the chunk's end: the prefix ends there (the robot holds after it).
    _, short = committed_prefix(queue, 4, 3, RP5, moved, CHUNK, trained=4)
    assert short.tolist() == [1, 1, 0, 0, 0, 0]
    # A delay past what the policy was trained on: it is told the first `trained` actions.
    _, capped = committed_prefix(queue, 0, 5, RP5, moved, CHUNK, trained=2)
    assert capped.tolist() == [1, 1, 0, 0, 0, 0]


@pytest.fixture(scope="module")
def conditioned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The tiny policy, delay-conditioned, its prefix encoder's weights made non-zero (as
    training leaves them): its checkpoint and its export."""
    from stages.export import export
    from stages.policy.checkpoint import new_policy, save_policy

    torch.manual_seed(0)
    config = TINY_POLICY.model_copy(update={"chunk_len": CHUNK, "prefix_ticks": PREFIX})
    policy, _ = new_policy(config, ["scene"], 32, "rp5", 6, 6, rp5_normalizer())
    assert policy.prefix_encoder is not None
    with torch.no_grad():
        for param in policy.prefix_encoder.parameters():
            param.normal_(0.0, 0.5)
    root = tmp_path_factory.mktemp("conditioned")
    save_policy(policy, root / "ckpt", None)
    return root / "ckpt", Path(export(root / "ckpt", root / "export", RP5.control_hz).path)


def observation(batch: int) -> BatchedObservation:
    rng = np.random.default_rng(3)
    return BatchedObservation(
        images={"scene": rng.integers(0, 256, (batch, 32, 32, 3), np.uint8)},
        state=np.zeros((batch, 6), np.float32),
        instruction=["touch the red cube"] * batch,
    )


def test_a_conditioned_policy_starts_as_before_and_its_export_takes_the_prefix(
    conditioned: tuple[Path, Path],
) -> None:
    from stages.evaluate.policies import load_acting_policy
    from stages.policy.checkpoint import new_policy

    # Made conditioned, a policy acts exactly as before until its prefix encoder trains.
    torch.manual_seed(0)
    plain, _ = new_policy(TINY_POLICY.model_copy(update={"chunk_len": CHUNK}), ["scene"], 32,
                          "rp5", 6, 6, rp5_normalizer())  # fmt: skip
    obs = observation(4)
    before = plain.predict_chunk(obs)
    plain.condition_on_prefix(PREFIX)
    prefix = np.full((4, CHUNK, 6), 0.01, np.float32)
    mask = np.zeros((4, CHUNK), np.float32)
    mask[:, :2] = 1.0
    assert np.array_equal(plain.predict_chunk(obs, prefix, mask), before)

    checkpoint, export_dir = conditioned
    spec = ExportedPolicy(export_dir).spec
    assert spec.prefix_ticks == PREFIX and spec.input_names[-2:] == ["prefix", "prefix_mask"]
    torch_policy, onnx_policy = load_acting_policy(checkpoint), load_acting_policy(export_dir)
    told = onnx_policy.predict_chunk(obs, prefix=prefix, prefix_mask=mask)  # type: ignore[call-arg]
    untold = onnx_policy.predict_chunk(obs)
    assert np.abs(told - untold).max() > 1e-3, "the prefix changes the chunk"
    expected = torch_policy.predict_chunk(obs, prefix=prefix, prefix_mask=mask)  # type: ignore[call-arg]
    assert np.allclose(told, expected, atol=1e-4), "the export computes what torch does"


class RecordingExport(ExportedPolicy):
    """The real export, remembering the prefix of every inference."""

    def __init__(self, export_dir: Path) -> None:
        super().__init__(export_dir)
        self.masks: list[np.ndarray] = []

    def infer(self, *args: object, **kwargs: object) -> np.ndarray:
        mask = kwargs.get("prefix_mask")
        self.masks.append(np.zeros(0) if mask is None else np.asarray(mask)[0].copy())
        return super().infer(*args, **kwargs)  # type: ignore[arg-type]


def test_the_async_runtime_tells_a_conditioned_policy_what_it_committed(
    conditioned: tuple[Path, Path],
) -> None:
    """d = 2 ticks: the first inference has nothing planned; every later one starts with the
    two actions the queue plans for the ticks it takes."""
    policy = RecordingExport(conditioned[1])
    robot = RecordingRobot(RP5)
    robot.connect()
    with AsyncControlLoop(
        policy, robot, "touch the red cube", inference_s=0.15, margin_s=0.0,
        pace=False,
    ) as loop:  # fmt: skip
        for _ in range(40):
            loop.tick()
            time.sleep(0.01)  # the worker thread infers meanwhile
    assert len(policy.masks) >= 3, policy.masks
    assert not policy.masks[0].any(), "nothing planned before the first chunk"
    assert all(m.tolist() == [1, 1, 0, 0, 0, 0] for m in policy.masks[1:]), policy.masks


class _Told:
    """A delay-conditioned chunking policy double: zero chunks; it records the prefix mask of
    every inference."""

    robot = "rp5"
    cameras: tuple[str, ...] = ()
    image_size, state_dim, action_dim, chunk_len, prefix_ticks = 32, 6, 6, CHUNK, PREFIX

    def __init__(self) -> None:
        self.masks: list[list[float]] = []

    def predict_chunk(
        self,
        obs: BatchedObservation,
        prefix: np.ndarray | None = None,
        prefix_mask: np.ndarray | None = None,
    ) -> np.ndarray:
        assert prefix is not None and prefix_mask is not None, "a conditioned policy is told"
        self.masks.append(prefix_mask[0].tolist())
        return np.zeros((len(obs.state), CHUNK, 6), np.float32)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_the_simulated_delay_tells_a_conditioned_policy_what_it_committed(
    mode: Literal["sync", "async"],
) -> None:
    """250 ms + 20 ms margin at 10 Hz: 3 ticks. async: after the first chunk, every inference
    is told the 3 actions the queue plans while it runs; sync: nothing (the robot holds)."""
    from stages.evaluate.config import DelayConfig
    from stages.evaluate.delay import DelayedActor, check_plan, delay_plan

    policy = _Told()
    plan = delay_plan(DelayConfig(mode=mode, inference_ms=250.0), RP5)
    assert plan is not None and plan.ticks == 3
    actor = DelayedActor(policy, check_plan(plan, policy, "told"), RP5)
    obs = BatchedObservation({}, np.zeros((1, 6), np.float32), ["touch"])
    env = type("Env", (), {"num_envs": 1})()
    for _ in range(12):
        actor.act(env, obs)
    assert len(policy.masks) >= 3 and not any(policy.masks[0])
    committed = [1.0] * 3 + [0.0] * 3 if mode == "async" else [0.0] * CHUNK
    assert all(mask == committed for mask in policy.masks[1:]), policy.masks


def test_bc_on_simulated_delays_trains_the_prefix_encoder_and_not_on_committed_actions(
    tiny_dataset: DatasetRef, tmp_path: Path
) -> None:
    """Behaviour cloning of a delay-conditioned policy feeds it the committed prefix: its
    prefix encoder's first layer learns (never fed one, its weights would only decay, all by
    one factor: AdamW's decoupled decay of a parameter with no gradient). The committed actions
    are given, not predicted: they are not in the loss."""
    from stages.finetune.bc import bc_loss, build_policy, train_bc
    from stages.finetune.data import load_bc_data
    from stages.policy.checkpoint import load_policy
    from tests.stages.test_finetune import tiny_job

    job = tiny_job(tmp_path / "bc", tiny_dataset, steps=20)
    job.policy = TINY_POLICY.model_copy(update={"chunk_len": 4, "prefix_ticks": 2})
    data = load_bc_data([tiny_dataset.path], ("scene",), 4)
    torch.manual_seed(job.seed)  # as train_bc starts: the same initial weights
    initial, _ = build_policy(job, data)
    assert initial.prefix_encoder is not None
    first = next(initial.prefix_encoder.parameters()).detach().clone()  # its first layer's weight
    train_bc(job)
    trained = load_policy(tmp_path / "bc" / "step-0000020").prefix_encoder
    assert trained is not None
    ratio = (next(trained.parameters()).detach() / first).flatten()
    assert float(ratio.std()) > 1e-3, "the prefix inputs were never fed"

    batch = data.batch(np.arange(16), np.random.default_rng(0), 0)
    batch |= {"prefix": np.zeros((16, 4, 6), np.float32), "prefix_mask": np.zeros((16, 4))}
    batch["prefix_mask"][:, :2] = 1.0
    tokens, mask = (torch.as_tensor(a) for a in initial.tokenizer(data.instructions))
    loss = bc_loss(initial, initial, batch, tokens, mask, 0.0)[1]
    batch["actions"] = batch["actions"].copy()
    batch["actions"][:, :2] += 1.0  # other committed actions: the same loss
    assert torch.isclose(bc_loss(initial, initial, batch, tokens, mask, 0.0)[1], loss)
    batch["actions"][:, 2:] += 1.0  # other actions after them: another loss
    assert not torch.isclose(bc_loss(initial, initial, batch, tokens, mask, 0.0)[1], loss)


def test_the_policy_server_passes_the_committed_prefix_to_a_conditioned_version(
    conditioned: tuple[Path, Path],
) -> None:
    """The agent's policy server (``WS /policy``) answers a frame that carries the prefix with
    the chunk the engine gives that prefix, and announces that the version takes one. The
    deployer is reduced to the policy it serves: the frame handling is what is tested."""
    from deploy_edge.agent.policy_server import _policy_info, _serve_one
    from deploy_edge.wire import ChunkFrame, ObservationFrame, encode_image, frame_text

    exported = ExportedPolicy(conditioned[1])
    serving = type("Serving", (), {"serving_policy": lambda _: (exported, "tiny:1", RP5)})()
    assert _policy_info(serving).prefix_ticks == PREFIX
    obs = observation(1)
    prefix = np.full((CHUNK, 6), 0.01, np.float32)
    mask = np.array([1, 1, 0, 0, 0, 0], np.float32)
    frame = ObservationFrame(
        1, 0.0, "touch the red cube", obs.state[0].tolist(),
        {"scene": encode_image(obs.images["scene"][0])},
        prefix=prefix.tolist(), prefix_mask=mask.tolist(),
    )  # fmt: skip
    told = ChunkFrame.from_json(json.loads(frame_text(_serve_one(serving, frame_text(frame)))))
    assert not told.error, told.error
    expected = exported.infer(obs.images, obs.state, obs.instruction, prefix[None], mask[None])
    assert np.allclose(told.actions, expected[0], atol=1e-6)
    frame.prefix, frame.prefix_mask = [], []
    untold = _serve_one(serving, frame_text(frame))
    assert np.allclose(untold.actions, exported.infer(obs.images, obs.state, obs.instruction)[0])
    assert not np.allclose(untold.actions, told.actions, atol=1e-3)
