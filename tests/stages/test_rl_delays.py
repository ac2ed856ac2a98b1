"""RL fine-tuning of a delay-conditioned policy plays delays (issue 52, point 3's RL half).

The committed actions' rule (:mod:`stages.finetune.committed`): an episode at delay ``d``
starts with ``d`` safe actions committed, each decision commits its actions after them, and
what executes was chosen ``d`` decisions before. Then the workers (PPO's rollouts, GRPO's
groups) record the prefix each decision saw, and every learner (PPO, GRPO, SAC) scores the
positions after it: in a first update step, the learner's log-probabilities of the workers'
actions are the workers' own (approx_kl 0), which they are not if it reads the chunk's first
positions or drops the prefix.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from robots.spec import RobotSpec
from stages.finetune.committed import CommittedActions
from stages.finetune.config import GRPOConfig, PPOConfig, SACConfig
from stages.finetune.grpo import GRPO
from stages.finetune.ppo import PPO
from stages.finetune.rollout import RolloutWorker, chunk_distribution, rl_parameters
from stages.finetune.sac import SAC, ReplayBuffer
from stages.policy.base import PolicyOutput
from stages.policy.checkpoint import load_policy, read_policy_meta, save_policy
from stages.policy.types import BaseRef
from tests.stages.test_rl import SCENE, SIM
from tests.stages.test_rl import start as start  # the module's fixture
from tests.stages.tiny_models import TINY_POLICY

PREFIX_TICKS = 2
"""Below the tiny policy's chunk of 3 (a decision's action after at most 2 committed)."""
CHUNK = TINY_POLICY.chunk_len


@pytest.fixture(scope="module")
def delayed(start: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The RL start made delay-conditioned (``prefix_ticks`` 2), its prefix encoder's last layer
    random (it starts at zero: the prefix would change nothing a test could see)."""
    torch.manual_seed(1)
    policy = load_policy(start)
    policy.condition_on_prefix(PREFIX_TICKS)
    assert policy.prefix_encoder is not None
    with torch.no_grad():  # its last layer (weight, bias): what training moves first
        for param in list(policy.prefix_encoder.parameters())[-2:]:
            param.normal_(std=0.1)
    out = tmp_path_factory.mktemp("rl-delayed") / "policy"
    save_policy(policy, out, BaseRef.from_json(read_policy_meta(start)["base"]))  # start's
    return str(out)


def committed_actions(rp5: RobotSpec, envs: int, horizon: int = 1) -> CommittedActions:
    return CommittedActions(rp5, envs, CHUNK, horizon, PREFIX_TICKS, np.random.default_rng(0))


def test_an_episode_at_delay_d_holds_then_executes_what_it_chose_d_decisions_before(
    rp5: RobotSpec,
) -> None:
    committed = committed_actions(rp5, envs=64)
    state = np.random.default_rng(1).uniform(-0.5, 0.5, (64, rp5.state_dim)).astype(np.float32)
    committed.restart(range(64), state)
    d = committed.delay.copy()
    assert set(d.tolist()) == {0, 1, 2}, "none, or 1..prefix_ticks"
    assert 20 < (d == 0).sum() < 44, "about half the episodes play no delay"
    chosen, executed = [], []
    for k in range(6):  # decision k chooses actions worth k + 1 in every component
        prefix = committed.prefix()
        assert (prefix["prefix_mask"].sum(axis=1) == d).all(), "d committed at every decision"
        choice = np.full((64, 1, rp5.action.dim), k + 1.0, np.float32)
        chosen.append(choice)
        executed.append(committed.commit(choice))
    hold = rp5.hold_action(state)
    for e in range(64):
        for k in range(6):
            want = hold[e] if k < d[e] else chosen[k - d[e]][e, 0]
            np.testing.assert_array_equal(executed[k][e, 0], want, err_msg=f"env {e} tick {k}")


def test_a_delay_leaves_room_for_the_decisions_actions_in_the_chunk(rp5: RobotSpec) -> None:
    committed = committed_actions(rp5, envs=64, horizon=2)  # chunk 3: at most 1 committed
    committed.restart(range(64), np.zeros((64, rp5.state_dim), np.float32))
    assert committed.delay.max() == 1


def test_the_decisions_distribution_is_over_the_positions_after_the_prefix() -> None:
    mean = torch.arange(2 * 5 * 1, dtype=torch.float32).reshape(2, 5, 1)
    out = PolicyOutput(mean, torch.zeros(1), torch.zeros(2, 5, 8), torch.zeros(2, 2))
    mask = torch.tensor([[0, 0, 0, 0, 0], [1, 1, 1, 0, 0]], dtype=torch.float32)
    assert chunk_distribution(out, 2).mean[:, :, 0].tolist() == [[0, 1], [5, 6]]
    assert chunk_distribution(out, 2, mask).mean[:, :, 0].tolist() == [[0, 1], [8, 9]]


def worker(checkpoint: str, envs: int = 4, **kinds: bool) -> RolloutWorker:
    kinds = {"kl_anchor": True, "value_head": True} | kinds
    return RolloutWorker(checkpoint, "rp5", SCENE, SIM, envs, 1, 0.98, 0, 0, **kinds)


def test_ppo_rollouts_play_delays_and_the_learner_scores_what_the_workers_chose(
    delayed: str,
) -> None:
    w = worker(delayed)
    try:
        batch = w.rollout(60)  # past an episode's 50 steps: restarts draw new delays
    finally:
        w.close()
    assert batch.prefix is not None and batch.prefix_mask is not None
    assert batch.prefix.shape == (61, 4, CHUNK, 6) and batch.prefix_mask.shape == (61, 4, CHUNK)
    committed = batch.prefix_mask.sum(axis=2).astype(int)
    assert committed.max() == PREFIX_TICKS and (committed == 0).any()
    # What a decision chose is committed last in the next decision's prefix (same episode).
    policy = load_policy(delayed)
    kept = np.nonzero((committed[:-1] > 0) & (committed[1:] == committed[:-1]))
    for t, e in zip(*kept, strict=True):
        if batch.terminated[t, e] or batch.truncated[t, e]:
            continue
        chosen = policy.denormalize_actions(torch.as_tensor(batch.actions[t, e])).numpy()[0]
        np.testing.assert_allclose(batch.prefix[t + 1, e, committed[t, e] - 1], chosen, atol=1e-5)
    reference = load_policy(delayed).requires_grad_(False)
    cfg = PPOConfig(epochs=1, minibatch_size=10_000)  # one step: its log-probs are before it
    metrics = PPO(policy, reference, rl_parameters(policy), cfg, 0.98, 1, 0).update(batch)
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6) and metrics["clip_frac"] == 0
    assert metrics["kl_ref"] == pytest.approx(0.0, abs=1e-6), "the anchor's means, same places"


def test_grpo_groups_play_delays_and_the_learner_scores_what_the_workers_chose(
    delayed: str,
) -> None:
    w = worker(delayed, envs=3, episodic=True, value_head=False)
    try:
        batch = w.play_groups([11, 12], group_size=2)
    finally:
        w.close()
    assert batch.prefix is not None and batch.prefix_mask is not None
    assert len(batch.prefix) == len(batch.logp)
    first = [int(np.flatnonzero(batch.episode == e)[0]) for e in range(4)]
    starts = batch.prefix_mask[first].sum(axis=1)
    episode_delay = [batch.prefix_mask[batch.episode == e].sum(axis=1) for e in range(4)]
    assert all((d == s).all() for d, s in zip(episode_delay, starts, strict=True)), "kept"
    policy, reference = load_policy(delayed), load_policy(delayed).requires_grad_(False)
    batch.success[:] = [True, False, True, False]  # every group mixed: every decision counts
    cfg = GRPOConfig(epochs=1, minibatch_size=10_000)
    metrics = GRPO(policy, reference, rl_parameters(policy), cfg, 0.98, 1, 0).update(batch)
    assert metrics["updates"] == 1
    assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)


def test_sac_replays_each_transitions_prefix_with_it(delayed: str) -> None:
    w = worker(delayed)
    try:
        batch = w.rollout(20)
    finally:
        w.close()
    buffer = ReplayBuffer(200)
    stored = buffer.add(batch)
    sample = buffer.sample(stored, np.random.default_rng(0))
    for when in ("obs", "next"):
        assert sample[when]["prefix"].shape == (stored, CHUNK, 6)
    assert batch.prefix_mask is not None
    assert sample["obs"]["prefix_mask"].sum() > 0, "delays were played"
    policy, reference = load_policy(delayed), load_policy(delayed).requires_grad_(False)
    cfg = SACConfig(batch_size=16, learning_starts=10, critic_warmup=0, updates_per_round=2)
    metrics = SAC(policy, reference, rl_parameters(policy), cfg, 0.98, 1, 0).update(batch)
    assert metrics["updates"] == 2 and np.isfinite(metrics["actor_loss"])
