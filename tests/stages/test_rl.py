"""RL fine-tuning: the known properties of PPO's, SAC's and GRPO's pieces, the learner's
updates on real rollouts, and the Ray run: weight sync, a killed rollout worker restarted, a
killed learner resumed from its checkpoint, and the named error when Ray may restart no
more."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from robots.spec import RobotSpec
from sim_scenes.config import RewardConfig, SceneConfig, SimConfig
from sim_scenes.touch import touch_variant
from stages.finetune.algorithm import ALGORITHMS, RLAlgorithm, algorithm_class
from stages.finetune.config import FinetuneConfig, GRPOConfig, PPOConfig, RLConfig, SACConfig
from stages.finetune.grpo import GRPO, group_advantages
from stages.finetune.heads import ValueHead
from stages.finetune.ppo import PPO, clipped_objective, gae
from stages.finetune.rl import RLJob, RLRun, train_rl
from stages.finetune.rollout import (
    VALUE_PREFIX,
    RolloutWorker,
    chunk_distribution,
    chunk_transition,
    pooled_features,
    rl_parameters,
)
from stages.finetune.rounds import Rollout, flatten_observations
from stages.finetune.sac import (
    SAC,
    ReplayBuffer,
    actor_loss,
    soft_q_target,
    temperature_loss,
)
from stages.policy.checkpoint import (
    checkpoint_hash,
    load_policy,
    new_policy,
    read_policy_meta,
    save_policy,
)
from stages.policy.types import BaseRef
from stages.worker_pool import WorkersDiedError
from tests.stages.tiny_models import TINY_POLICY

SCENE = SceneConfig(image_size=32, reward=RewardConfig(progress_weight=2.0))
SIM = SimConfig(num_threads=1)


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory, rp5: RobotSpec) -> str:
    """A tiny base checkpoint and a LoRA checkpoint on it (the RL start)."""
    root = tmp_path_factory.mktemp("rl-start")
    torch.manual_seed(0)
    base, _ = new_policy(TINY_POLICY, ["scene"], 32, rp5.name, rp5.state_dim, rp5.action.dim)
    save_policy(base, root / "base", None)
    policy = load_policy(root / "base")
    policy.add_lora(TINY_POLICY.lora)
    ref = BaseRef("checkpoint", str(root / "base"), checkpoint_hash(root / "base"))
    save_policy(policy, root / "lora", ref)
    return str(root / "lora")


def worker(start: str, envs: int = 3, horizon: int = 1, **kinds: bool) -> RolloutWorker:
    """A rollout worker of the tiny policy; ``kinds``: ``kl_anchor``, ``value_head`` (both on
    by default: what PPO's workers run), ``episodic``."""
    kinds = {"kl_anchor": True, "value_head": True} | kinds
    return RolloutWorker(start, "rp5", SCENE, SIM, envs, horizon, 0.98, 0, 0, **kinds)


# -- the algorithms' pieces --------------------------------------------------------------------


def test_gae_matches_a_hand_worked_example() -> None:
    rewards = np.array([[1.0], [2.0], [3.0]], np.float32)
    values = np.array([[0.5], [1.0], [1.5], [2.0]], np.float32)
    solved = np.array([[False], [True], [False]])
    cut = np.zeros_like(solved)
    adv, ret = gae(rewards, values, solved, cut, gamma=0.5, lam=0.5)
    # t=2: 3 + 0.5*2.0 - 1.5 = 2.5 ; t=1 (solved): 2 - 1.0 = 1.0 (no bootstrap, trace cut)
    # t=0: delta 1 + 0.5*1.0 - 0.5 = 1.0, plus 0.5*0.5*1.0 = 1.25
    np.testing.assert_allclose(adv[:, 0], [1.25, 1.0, 2.5], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], [1.75, 2.0, 4.0], rtol=1e-6)
    # A step-limit cut bootstraps from the decision's own value instead of the next episode's.
    adv_cut, _ = gae(rewards[:1], values[:2], np.array([[False]]), np.array([[True]]), 0.5, 0.5)
    assert adv_cut[0, 0] == pytest.approx(1.0 + 0.5 * 0.5 - 0.5)
    # float32 out, whatever comes in (the learner's tensors are float32)
    adv64, ret64 = gae(rewards.astype(np.float64), values.astype(np.float64), solved, cut, 0.5, 0.5)
    assert adv64.dtype == ret64.dtype == np.float32


def test_clipped_objective_stops_pushing_past_the_clip() -> None:
    advantages = torch.tensor([1.0, -1.0])
    old = torch.zeros(2)
    inside = torch.zeros(2, requires_grad=True)  # ratio 1
    loss, clip_frac = clipped_objective(inside, old, advantages, clip=0.2)
    assert loss.item() == pytest.approx(0.0) and clip_frac.item() == 0.0
    loss.backward()
    assert inside.grad is not None and inside.grad.abs().sum() > 0
    # ratio 1.5 with a positive advantage, 0.5 with a negative one: both clipped, no gradient
    beyond = torch.log(torch.tensor([1.5, 0.5])).requires_grad_(True)
    loss, clip_frac = clipped_objective(beyond, old, advantages, clip=0.2)
    loss.backward()
    assert clip_frac.item() == 1.0
    assert beyond.grad is not None and torch.all(beyond.grad == 0)
    assert loss.item() == pytest.approx(-(1.2 * 1.0 + 0.8 * -1.0) / 2)
    # the ratio is pi / pi_old: log-probs -1.1 and -0.9 against -1.0 are ratios e^-0.1 and
    # e^0.1, inside the clip; advantages 2 and -0.5
    logp, old_logp = torch.tensor([-1.1, -0.9]), torch.tensor([-1.0, -1.0])
    loss, clip_frac = clipped_objective(logp, old_logp, torch.tensor([2.0, -0.5]), clip=0.2)
    expected = -(np.exp(-0.1) * 2.0 + np.exp(0.1) * -0.5) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-5) and clip_frac.item() == 0.0
    # a ratio exactly at the clip boundary is not counted as clipped
    at_boundary = clipped_objective(torch.zeros(2), old, advantages, clip=0.0)[1]
    assert at_boundary.item() == 0.0


def test_soft_q_target_matches_a_hand_worked_example() -> None:
    y = soft_q_target(
        reward=torch.tensor([1.0, 1.0]),
        solved=torch.tensor([False, True]),
        next_q1=torch.tensor([2.0, 2.0]),
        next_q2=torch.tensor([3.0, 3.0]),
        next_logp=torch.tensor([-2.0, -2.0]),
        alpha=0.5,
        discount=0.9,
    )
    # min(2, 3) - 0.5 * (-2) = 3.0 ; 1 + 0.9 * 3.0 = 3.7 ; solved: no bootstrap
    torch.testing.assert_close(y, torch.tensor([3.7, 1.0]))


def test_a_chunk_discounts_inside_and_stops_at_the_episode_end() -> None:
    # horizon 3, gamma 0.9; columns are environments
    rewards = np.array(
        [
            [1.0, 1.0, 5.0, 0.5, 1.0],
            [2.0, 2.0, 7.0, 0.5, 1.0],
            [3.0, 100.0, 7.0, 0.5, 10.0],
        ],
        np.float32,
    )
    terminated = np.zeros((3, 5), bool)
    truncated = np.zeros((3, 5), bool)
    terminated[1, 1] = True  # solved at the 2nd action: the 3rd is the next episode's
    truncated[0, 2] = True  # cut by the step limit at the 1st action
    terminated[2, 3] = True  # solved at the last action
    truncated[1, 4], terminated[2, 4] = True, True  # cut; the next episode's success is not ours
    reward, solved, cut = chunk_transition(rewards, terminated, truncated, gamma=0.9)
    # 1 + .9*2 + .81*3 | 1 + .9*2 | 5 | .5 + .45 + .405 | 1 + .9*1
    np.testing.assert_allclose(reward, [5.23, 2.8, 5.0, 1.355, 1.9], rtol=1e-6)
    assert solved.tolist() == [False, True, False, True, False]
    assert cut.tolist() == [False, False, True, False, True]
    assert reward.dtype == np.float32


def synthetic_rollout(
    reward: np.ndarray, terminated: np.ndarray | None = None, truncated: np.ndarray | None = None
) -> Rollout:
    """A rollout of ``reward.shape`` = (T, N) decisions that the tiny policy can read, whose
    observations encode (t, n): ``state[t, n, 0] = t``, ``state[t, n, 1] = n``, every image
    pixel = 10 t + n."""
    steps, envs = reward.shape
    tokens = TINY_POLICY.max_tokens
    t, n = np.meshgrid(np.arange(steps + 1), np.arange(envs), indexing="ij")
    state = np.zeros((steps + 1, envs, 6), np.float32)
    state[..., 0], state[..., 1] = t, n
    pixels = (10 * t + n).astype(np.uint8)[..., None, None, None]
    return Rollout(
        images={"scene": np.broadcast_to(pixels, (steps + 1, envs, 32, 32, 3)).copy()},
        state=state,
        tokens=np.zeros((steps + 1, envs, tokens), np.int64),
        token_mask=np.ones((steps + 1, envs, tokens), np.int64),
        actions=np.zeros((steps, envs, 1, 6), np.float32),
        logp=np.zeros((steps, envs), np.float32),
        reward=reward.astype(np.float32),
        terminated=np.zeros((steps, envs), bool) if terminated is None else terminated,
        truncated=np.zeros((steps, envs), bool) if truncated is None else truncated,
    )


def test_ppo_discounts_decisions_by_gamma_to_the_horizon(start: str) -> None:
    """Four decisions of 3-action chunks, solved at the 2nd: GAE with gamma^3 and lambda."""
    policy = load_policy(start)
    ppo = PPO(policy, policy, rl_parameters(policy), PPOConfig(gae_lambda=0.8), 0.9, 3, 0)
    solved = np.array([[False], [True], [False], [False]])
    batch = synthetic_rollout(np.array([[1.0], [2.0], [0.5], [1.5]]), terminated=solved)
    values = np.array([[0.2], [0.4], [0.6], [0.8], [1.0]], np.float32)
    advantages, returns = ppo.advantages(batch, values)
    # discount d = 0.9^3 = 0.729, d * lambda = 0.5832
    # t=3: 1.5 + .729*1.0 - .8 = 1.429
    # t=2: .5 + .729*.8 - .6 = .4832, + .5832 * 1.429 = 1.3165928
    # t=1 (solved): 2.0 - .4 = 1.6, no bootstrap, the trace stops
    # t=0: 1 + .729*.4 - .2 = 1.0916, + .5832 * 1.6 = 2.02472
    np.testing.assert_allclose(advantages[:, 0], [2.02472, 1.6, 1.3165928, 1.429], rtol=1e-5)
    np.testing.assert_allclose(returns[:, 0], [2.22472, 2.0, 1.9165928, 2.229], rtol=1e-5)


def test_sac_discounts_decisions_by_gamma_to_the_horizon(start: str) -> None:
    policy = load_policy(start)
    sac = SAC(policy, policy, rl_parameters(policy), SACConfig(), 0.9, 3, 0)
    assert sac.discount == pytest.approx(0.729)


def test_sac_actor_loss_matches_a_hand_worked_example() -> None:
    logp = torch.tensor([-1.0, -3.0])
    q1 = torch.tensor([2.0, 1.0], requires_grad=True)
    q2 = torch.tensor([1.5, 4.0], requires_grad=True)
    loss = actor_loss(0.5, logp, q1, q2, torch.tensor(0.2), kl_coef=0.1)
    # sample 0: .5 * -1 - min(2, 1.5) = -2.0 ; sample 1: .5 * -3 - min(1, 4) = -2.5
    # mean -2.25, plus 0.1 * 0.2
    assert loss.item() == pytest.approx(-2.23)
    loss.backward()
    # minimising pushes up the smaller critic of each sample, and only that one
    assert q1.grad is not None and q2.grad is not None
    assert q1.grad.tolist() == [0.0, -0.5] and q2.grad.tolist() == [-0.5, 0.0]


def test_sac_temperature_loss_matches_a_hand_worked_example() -> None:
    log_alpha = torch.tensor(np.log(0.5), requires_grad=True)
    # entropy -log pi = [1, 3], mean 2, above the target -2: alpha must fall
    loss = temperature_loss(log_alpha, torch.tensor([-1.0, -3.0]), target_entropy=-2.0)
    # -mean(log .5 * [-3, -5]) = 4 log .5
    assert loss.item() == pytest.approx(4 * np.log(0.5))
    loss.backward()
    assert log_alpha.grad is not None and log_alpha.grad.item() == pytest.approx(4.0)
    # entropy [-3, -5], below the target -2: the gradient raises alpha
    low = torch.tensor(np.log(0.5), requires_grad=True)
    temperature_loss(low, torch.tensor([3.0, 5.0]), target_entropy=-2.0).backward()
    assert low.grad is not None and low.grad.item() == pytest.approx(-2.0)


@pytest.mark.parametrize(("target_entropy", "alpha_moves"), [(50.0, "up"), (-50.0, "down")])
def test_sac_temperature_follows_the_entropy_target(
    start: str, target_entropy: float, alpha_moves: str
) -> None:
    """Through the learner's update: a target far above the policy's entropy (a few nats over
    6 action dimensions) raises alpha, one far below lowers it."""
    rng = np.random.default_rng(0)
    batch = synthetic_rollout(rng.normal(size=(6, 2)))
    policy, reference = load_policy(start), load_policy(start).requires_grad_(False)
    cfg = SACConfig(
        batch_size=4,
        learning_starts=0,
        critic_warmup=0,
        updates_per_round=3,
        init_alpha=0.1,
        target_entropy=target_entropy,
    )
    sac = SAC(policy, reference, rl_parameters(policy), cfg, 0.98, 1, 0)
    sac.update(batch)
    alpha = sac.log_alpha.exp().item()
    assert (alpha > 0.1) if alpha_moves == "up" else (alpha < 0.1), alpha


# -- on real rollouts ----------------------------------------------------------------------


def test_rollouts_carry_chunks_rewards_and_episode_ends(start: str) -> None:
    w = worker(start, envs=2, horizon=2)
    try:
        r = w.rollout(30)  # 60 control steps: every episode (50 steps) has ended once
    finally:
        w.close()
    assert r.actions.shape == (30, 2, 2, 6) and r.logp.shape == (30, 2)
    assert r.images["scene"].shape == (31, 2, 32, 32, 3) and r.tokens.shape[:2] == (31, 2)
    assert r.env_steps == 30 * 2 * 2
    assert (r.terminated | r.truncated).sum() >= 2 and len(r.success) >= 2
    assert np.all(r.reward[~r.terminated] < 1.0), "the success bonus only on solved decisions"


def test_rl_plays_the_simulators_reward_with_the_configs_terms(rp5: RobotSpec) -> None:
    """Rollouts read ``StepResult.reward`` of the task :meth:`SceneConfig.rl_task` gives: the
    variant's terms with ``scene.reward`` applied (progress shaping here); datasets and
    evaluations play :meth:`SceneConfig.task`, the variant's own."""
    from sim_scenes.backends import open_env

    rl, own = touch_variant(SCENE.rl_task()), touch_variant(SCENE.task())
    assert rl.reward.progress_weight == 2.0 != own.reward.progress_weight
    assert replace(rl, reward=own.reward) == own, "only the reward differs"
    rng = np.random.default_rng(0)
    with open_env(rp5, rl, SIM, num_envs=2, cameras=(), image_size=32) as env:
        env.reset([1, 2])
        for _ in range(5):
            result = env.step(rng.uniform(-0.05, 0.05, (2, rp5.action.dim)).astype(np.float32))
            info = result.info
            d, before = info["tcp_target_distance"], info["tcp_target_distance_before"]
            expected = rl.reward(result.success, d, before)
            np.testing.assert_allclose(result.reward, expected, rtol=1e-6)
            assert np.any(result.reward != own.reward(result.success, d, before))


def test_workers_record_the_values_and_anchor_means_of_the_states_they_visit(start: str) -> None:
    """What the learner no longer recomputes: V(obs[t]) for t = 0..T from the synced value head
    and the start policy's means at obs[t] for t < T, as the learner would compute them."""
    w = worker(start, envs=2)
    try:
        synced = {n: a + 0.01 for n, a in w.weights().items()}  # not the constructor's weights
        r = w.rollout(5, synced, version=1)
    finally:
        w.close()
    flat = flatten_observations(r)
    policy, value = load_policy(start).eval(), ValueHead(TINY_POLICY.d_model)
    params = dict(policy.named_parameters()) | {
        VALUE_PREFIX + n: p for n, p in value.named_parameters()
    }
    reference = load_policy(start).eval()
    with torch.no_grad():
        for name, array in synced.items():
            params[name].copy_(torch.from_numpy(array))
        out = policy(**flat.observations(np.arange(6 * 2)))
        expected_value = value(pooled_features(out)).numpy().reshape(6, 2)
        anchor = reference(**flat.observations(np.arange(5 * 2))).mean[:, :1].numpy()
    assert r.value is not None and r.ref_mean is not None
    np.testing.assert_allclose(r.value, expected_value, atol=1e-5)
    np.testing.assert_allclose(r.ref_mean, anchor.reshape(5, 2, 1, 6), atol=1e-5)


def test_ppo_value_loss_falls_on_a_fixed_batch(start: str) -> None:
    w = worker(start)
    try:
        batch = w.rollout(16)
    finally:
        w.close()
    torch.manual_seed(0)
    policy, reference = load_policy(start), load_policy(start).requires_grad_(False)
    params = rl_parameters(policy)
    assert not any(n.startswith("target_head") for n in params), "the aux head does not sync"
    ppo = PPO(policy, reference, params, PPOConfig(epochs=1, minibatch_size=48), 0.98, 1, 0)
    losses = [ppo.update(batch)["value_loss"] for _ in range(25)]
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(np.isfinite(losses))


def test_sac_fills_its_buffer_then_updates(start: str) -> None:
    w = worker(start)
    try:
        batches = [w.rollout(8) for _ in range(3)]
    finally:
        w.close()
    policy, reference = load_policy(start), load_policy(start).requires_grad_(False)
    params = rl_parameters(policy)
    before = {n: p.detach().clone() for n, p in params.items()}
    cfg = SACConfig(batch_size=16, learning_starts=30, critic_warmup=2, updates_per_round=3)
    sac = SAC(policy, reference, params, cfg, 0.98, 1, 0)
    first = sac.update(batches[0])
    assert first["updates"] == 0 and first["buffer"] == 24 - batches[0].truncated.sum()
    later = [sac.update(b) for b in batches[1:]]
    assert all(m["updates"] == 3 and np.isfinite(m["critic_loss"]) for m in later)
    assert "actor_loss" in later[-1], "the actor trains after the critic warm-up"
    assert any(not torch.equal(before[n], p) for n, p in params.items())


def test_replay_buffer_keeps_the_newest_transitions(start: str) -> None:
    """Real rollouts fit the buffer; on a wrap-around the newest transitions overwrite the
    oldest, and each keeps its own observation and next observation."""
    w = worker(start, envs=2)
    try:
        real = w.rollout(6)
    finally:
        w.close()
    buffer = ReplayBuffer(capacity=5)
    buffer.add(real)
    sample = buffer.sample(4, np.random.default_rng(0))
    assert sample["obs"]["images"]["scene"].shape == (4, 32, 32, 3)
    assert sample["actions"].shape == (4, 1, 6)

    # rewards 10 t + n + 1 name the transitions; decision (1, 0) is a step-limit cut
    t, n = np.meshgrid(np.arange(4), np.arange(2), indexing="ij")
    cut = np.zeros((4, 2), bool)
    cut[1, 0] = True
    buffer = ReplayBuffer(capacity=5)
    assert buffer.add(synthetic_rollout(10.0 * t + n + 1, truncated=cut)) == 7
    assert len(buffer) == 5 and buffer.cursor == 2
    # stored in order 1, 2, 12, 21, 22, 31, 32: the last two overwrote slots 0 and 1
    assert buffer.data["reward"].tolist() == [31, 32, 12, 21, 22]
    later = synthetic_rollout(np.array([[100.0, 101.0]]))
    assert buffer.add(later) == 2
    assert buffer.data["reward"].tolist() == [31, 32, 100, 101, 22] and buffer.cursor == 4
    # each slot holds its own (obs, next): next is one decision later in the same environment
    assert buffer.data["obs/state"][:, :2].tolist() == [[3, 0], [3, 1], [0, 0], [0, 1], [2, 1]]
    assert buffer.data["next/state"][:, 0].tolist() == [4, 4, 1, 1, 3]
    assert buffer.data["next/image/scene"][:, 0, 0, 0].tolist() == [40, 41, 10, 11, 31]


def test_replay_buffer_samples_only_filled_slots() -> None:
    buffer = ReplayBuffer(capacity=100)
    buffer.add(synthetic_rollout(np.array([[5.0, 6.0], [7.0, 8.0]])))
    sample = buffer.sample(500, np.random.default_rng(0))
    assert set(sample["reward"].tolist()) == {5.0, 6.0, 7.0, 8.0}, "never an empty slot"
    assert sample["obs"]["state"].shape == (500, 6)


# -- GRPO ------------------------------------------------------------------------------------


def test_grpo_advantages_within_a_group_sum_to_zero() -> None:
    outcomes = np.array([1, 0, 0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0, 0, 0, 0], np.float32)
    groups = np.repeat(np.arange(4), 4)
    advantages, kept = group_advantages(outcomes, groups)
    # group 0: mean 0.25, std sqrt(0.1875): 0.75 / 0.4330 = 1.732, -0.25 / 0.4330 = -0.577
    np.testing.assert_allclose(advantages[:4], [1.7320, -0.5773, -0.5773, -0.5773], atol=1e-3)
    assert kept.tolist() == [True] * 8 + [False] * 8, "all-success and all-failure: dropped"
    assert not advantages[8:].any()
    rng = np.random.default_rng(0)
    groups = rng.integers(0, 5, 200)
    advantages, _ = group_advantages(rng.random(200), groups)
    for g in range(5):
        assert abs(advantages[groups == g].sum()) < 1e-4


def test_a_zero_advantage_gives_no_gradient() -> None:
    logp = torch.randn(8, requires_grad=True)
    loss, _ = clipped_objective(logp, logp.detach() + 0.3, torch.zeros(8), 0.2, 0.28)
    loss.backward()
    assert logp.grad is not None and not logp.grad.any()


def test_clip_high_lets_a_good_action_grow_further_than_clip() -> None:
    logp = torch.log(torch.tensor([1.25])).requires_grad_()
    _, symmetric = clipped_objective(logp, torch.zeros(1), torch.ones(1), 0.2)
    loss, higher = clipped_objective(logp, torch.zeros(1), torch.ones(1), 0.2, 0.28)
    loss.backward()
    assert symmetric.item() == 1.0 and higher.item() == 0.0
    assert logp.grad is not None and logp.grad.item() < 0, "ratio 1.25 < 1.28: still pushed up"


def test_play_groups_plays_every_seed_group_size_times(start: str) -> None:
    w = worker(start, envs=3, episodic=True, value_head=False, kl_anchor=False)
    try:
        batch = w.play_groups([11, 12], group_size=2)
    finally:
        w.close()
    assert batch.group.tolist() == [0, 0, 1, 1] and batch.success.shape == (4,)
    lengths = np.bincount(batch.episode, minlength=4)
    assert lengths.sum() == batch.env_steps == len(batch.logp) == len(batch.actions)
    assert all(1 <= n <= 50 for n in lengths)
    first = [int(np.flatnonzero(batch.episode == e)[0]) for e in range(4)]
    same_seed = [
        np.array_equal(batch.images["scene"][first[a]], batch.images["scene"][first[b]])
        for a, b in ((0, 1), (2, 3), (0, 2))
    ]
    assert same_seed == [True, True, False], "a group starts from one scene, groups differ"
    assert batch.ref_mean is None and batch.actions.shape[1:] == (1, 6)


def test_grpo_pushes_up_the_successful_episode_and_ignores_identical_outcomes(
    start: str,
) -> None:
    w = worker(start, envs=4, episodic=True, value_head=False, kl_anchor=False)
    try:
        batch = w.play_groups([21, 22], group_size=2)
    finally:
        w.close()
    policy, reference = load_policy(start), load_policy(start).requires_grad_(False)
    params = rl_parameters(policy)
    grpo = GRPO(policy, reference, params, GRPOConfig(lr=1e-3, minibatch_size=1000), 0.98, 1, 0)
    before = {n: p.detach().clone() for n, p in params.items()}
    batch.success[:] = [True, True, False, False]  # each group all-success or all-failure
    metrics = grpo.update(batch)
    assert metrics["updates"] == 0 and metrics["groups_kept"] == 0
    assert all(torch.equal(before[n], p) for n, p in params.items()), "no signal, no step"

    def episode_logp() -> np.ndarray:
        with torch.no_grad():
            out = policy(**batch.observations(np.arange(len(batch.logp))))
            logp = chunk_distribution(out, 1).log_prob(torch.as_tensor(batch.actions))
        per_decision = logp.sum(dim=(1, 2)).numpy()
        return np.array([per_decision[batch.episode == e].mean() for e in range(4)])

    batch.success[:] = [True, False, False, False]  # group 0 mixed, group 1 all-failure
    start_logp = episode_logp()
    metrics = grpo.update(batch)
    change = episode_logp() - start_logp
    assert metrics["updates"] == 1 and metrics["groups_kept"] == 1
    assert change[0] > 0 > change[1], f"success pushed up, failure down: {change}"
    assert metrics["decisions_kept"] == np.isin(batch.episode, [0, 1]).sum()


def test_grpo_needs_one_action_per_decision() -> None:
    with pytest.raises(ValueError, match="horizon must be 1"):
        FinetuneConfig.model_validate({"algo": "grpo", "rl": {"horizon": 2}})


# -- the registry ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_every_registered_algorithm_has_a_class_and_a_config_section(name: str) -> None:
    algorithm = algorithm_class(name)
    assert issubclass(algorithm, RLAlgorithm) and not inspect.isabstract(algorithm)
    assert isinstance(algorithm.on_policy, bool) and algorithm.loss_metrics
    assert RLConfig().settings(name) is getattr(RLConfig(), name)
    assert FinetuneConfig(algo=name).is_rl


def test_an_unknown_algorithm_names_the_registered_ones() -> None:
    with pytest.raises(ValueError, match="unknown algorithm 'dqn'; valid choices: bc, ppo, "):
        FinetuneConfig(algo="dqn")
    with pytest.raises(ValueError, match="unknown RL algorithm 'bc'"):
        algorithm_class("bc")
    assert not FinetuneConfig().is_rl


def test_the_classes_ask_of_the_workers_what_each_algorithm_needs() -> None:
    """PPO's workers record values and the anchor; SAC's learner computes the anchor itself;
    GRPO plays groups, with no anchor at its default kl_coef 0."""
    rl = RLConfig()
    kinds = {name: algorithm_class(name).worker_kinds(rl.settings(name)) for name in ALGORITHMS}
    assert kinds == {
        "ppo": {"kl_anchor": True, "value_head": True, "episodic": False},
        "sac": {"kl_anchor": False, "value_head": False, "episodic": False},
        "grpo": {"kl_anchor": False, "value_head": False, "episodic": True},
    }
    with_anchor = rl.grpo.model_copy(update={"kl_coef": 0.1})
    assert algorithm_class("grpo").worker_kinds(with_anchor)["kl_anchor"]
    assert [rl.learner_torch_threads(algorithm_class(n).on_policy, 8) for n in ALGORITHMS] == [
        8,
        1,
        8,
    ]


# -- on Ray ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[None]:
    from stages.ray_runtime import init_ray

    init_ray(num_cpus=2)
    yield
    import ray

    ray.shutdown()


def job(start: str, out: Path, algo: str, **rl: object) -> RLJob:
    cfg = RLConfig.model_validate(
        {
            "iterations": 4,
            "workers": 2,
            "envs_per_worker": 2,
            "worker_cpus": 0.5,
            "learner_cpus": 0.5,
            "checkpoint_every": 2,
            "ppo": {"steps_per_env": 3, "minibatch_size": 6},
            "sac": {"steps_per_env": 3, "batch_size": 8, "learning_starts": 8, "critic_warmup": 1},
            **rl,
        }
    )
    return RLJob(str(out), start, algo, "rp5", SCENE, SIM, cfg, 0)


def test_ppo_on_ray_syncs_weights_and_restarts_a_killed_worker(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    import ray

    checks: list[bool] = []
    lines: list[str] = []
    policy_bytes: list[int] = []

    def on_iteration(run: RLRun) -> None:
        if run.iteration == 1:  # its rollout of iteration 2 is under way: played again
            pid = run.pool.pids[0]
            assert pid is not None, "seen in the first round"
            os.kill(pid, signal.SIGKILL)
        if run.iteration == 3:
            learner = ray.get(run.learner.weights.remote())
            assert any(n.startswith("value/") for n in learner), "PPO's workers value states"
            policy_bytes.append(
                sum(a.nbytes for n, a in learner.items() if not n.startswith("value/"))
            )
            for w in run.workers:
                theirs = ray.get(w.weights.remote())
                checks.append(all(np.array_equal(learner[n], theirs[n]) for n in learner))

    final = train_rl(
        job(start, tmp_path, "ppo", sync_dtype="float32"),
        on_iteration=on_iteration,
        on_status=lines.append,
    )
    assert checks == [True, True], "after a sync every worker holds the learner's parameters"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["replacements"] == 1
    assert len(lines) == 1 and re.match(
        r"RL rollout worker 1 of 2 \(pid \d+\) died; restarted as pid \d+, which redid its "
        r"rollout of iteration 2$",
        lines[0],
    ), lines
    assert policy_bytes[0] < records[0]["full_model_bytes"], "the policy syncs only adapters"
    assert final.name == "step-0000004" and (tmp_path / "learning_curves.png").is_file()
    meta = read_policy_meta(final)
    assert meta["trainable"] == "lora" and meta["lineage"]["step"] == 4
    before, after = load_policy(start), load_policy(final)
    changed = [
        n
        for n, p in after.trainable_state().items()
        if not torch.equal(p, before.trainable_state()[n])
    ]
    assert changed and all(not n.startswith("target_head") for n in changed)


def test_grpo_on_ray_plays_groups_and_its_learner_uses_every_core(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    import ray

    threads: list[int] = []

    def on_iteration(run: RLRun) -> None:
        threads.append(ray.get(run.learner.state.remote())["threads"])

    grpo = {"group_size": 2, "groups_per_worker": 1, "minibatch_size": 32}
    final = train_rl(
        job(start, tmp_path, "grpo", iterations=2, grpo=grpo), on_iteration=on_iteration
    )
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["episodes"] == 4 and r["groups"] == 2 for r in records), "2 workers x 1 x 2"
    assert all(
        4 <= r["env_steps"] - p <= 200
        for r, p in zip(records, [0, records[0]["env_steps"]], strict=True)
    )
    assert threads == [os.cpu_count()] * 2, "on-policy: the learner takes the idle cores"
    assert final.name == "step-0000002" and (tmp_path / "learning_curves.png").is_file()


def kill_learner_at(iteration: int) -> Callable[[RLRun], None]:
    """An ``on_iteration`` that kills the learner's process (``kill -9``) after ``iteration``,
    once."""
    import ray

    done: list[int] = []

    def kill(run: RLRun) -> None:
        if run.iteration == iteration and not done:
            done.append(ray.get(run.learner.state.remote())["pid"])
            os.kill(done[0], signal.SIGKILL)

    return kill


def test_sac_learner_killed_is_restarted_from_its_checkpoint(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    lines: list[str] = []
    final = train_rl(
        job(start, tmp_path, "sac"), on_iteration=kill_learner_at(3), on_status=lines.append
    )
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 3, 4], "iteration 3 was done again from the checkpoint of 2"
    assert final.name == "step-0000004"
    state = json.loads((final / "training" / "state.json").read_text())
    assert state["step"] == 4 and state["algo"]["updates"] > 0
    assert len(lines) == 1 and re.match(
        r"RL learner \(pid \d+\) died after iteration 3; restarted as pid \d+ from its "
        r"checkpoint of iteration 2; iteration 3 is done again$",
        lines[0],
    ), lines


def test_a_learner_dead_once_too_often_is_named_and_a_rerun_resumes(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    with pytest.raises(WorkersDiedError, match=r"finetune.rl.max_worker_restarts = 0 times"):
        train_rl(
            job(start, tmp_path, "sac", max_worker_restarts=0), on_iteration=kill_learner_at(3)
        )
    assert (tmp_path / "step-0000002").is_dir() and not (tmp_path / "step-0000004").exists()
    final = train_rl(job(start, tmp_path, "sac"))
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 3, 4], "the re-run continued after iteration 2, not from scratch"
    assert final.name == "step-0000004"


def test_asking_for_more_cpus_than_the_cluster_has_is_named(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    with pytest.raises(ValueError, match=r"asks for 4.5 CPUs .* cluster has 2"):
        train_rl(job(start, tmp_path, "ppo", workers=4, worker_cpus=1.0))
