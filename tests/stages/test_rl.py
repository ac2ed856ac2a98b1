"""RL fine-tuning: the known properties of PPO's and SAC's pieces, the learner's updates on real
rollouts, and the Ray run: weight sync, a dead rollout worker replaced, a dead learner resumed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from robots.spec import RobotSpec
from sim_scenes.config import RewardConfig, SceneConfig, SimConfig
from stages.finetune.config import PPOConfig, RLConfig, SACConfig
from stages.finetune.ppo import PPO, clipped_objective, gae
from stages.finetune.rl import LearnerLost, RLJob, RLRun, train_rl
from stages.finetune.rollout import RolloutWorker, rl_parameters
from stages.finetune.sac import SAC, ReplayBuffer, soft_q_target
from stages.policy.checkpoint import (
    BaseRef,
    checkpoint_hash,
    load_policy,
    new_policy,
    read_policy_meta,
    save_policy,
)
from tests.stages.tiny_models import TINY_POLICY

SCENE = SceneConfig(image_size=32, reward=RewardConfig(progress_weight=2.0))
SIM = SimConfig(num_threads=1)


@pytest.fixture(scope="module")
def start(tmp_path_factory: pytest.TempPathFactory, rp5: RobotSpec) -> str:
    """A tiny base checkpoint and a LoRA checkpoint on it (the RL start)."""
    root = tmp_path_factory.mktemp("rl-start")
    torch.manual_seed(0)
    base, _ = new_policy(TINY_POLICY, ["scene"], 32, len(rp5.state_names), rp5.action.dim)
    save_policy(base, root / "base", None)
    policy = load_policy(root / "base")
    policy.add_lora(TINY_POLICY.lora)
    ref = BaseRef("checkpoint", str(root / "base"), checkpoint_hash(root / "base"))
    save_policy(policy, root / "lora", ref)
    return str(root / "lora")


def worker(start: str, envs: int = 3, horizon: int = 1) -> RolloutWorker:
    return RolloutWorker(
        start, "rp5", SCENE.model_dump(), SIM.model_dump(), envs, horizon, 0.98, 0, 0
    )


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


def test_soft_q_target_matches_a_hand_worked_example() -> None:
    y = soft_q_target(
        reward=torch.tensor([1.0, 1.0]),
        solved=torch.tensor([False, True]),
        next_q1=torch.tensor([2.0, 2.0]),
        next_q2=torch.tensor([3.0, 3.0]),
        next_logp=torch.tensor([-1.0, -1.0]),
        alpha=0.5,
        discount=0.9,
    )
    # min(2, 3) - 0.5 * (-1) = 2.5 ; 1 + 0.9 * 2.5 = 3.25 ; solved: no bootstrap
    torch.testing.assert_close(y, torch.tensor([3.25, 1.0]))


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
    w = worker(start, envs=2)
    try:
        batch = w.rollout(6)
    finally:
        w.close()
    buffer = ReplayBuffer(capacity=5)
    buffer.add(batch)
    assert len(buffer) == 5
    sample = buffer.sample(4, np.random.default_rng(0))
    assert sample["obs"]["images"]["scene"].shape == (4, 32, 32, 3)
    assert sample["actions"].shape == (4, 1, 6)


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
    return RLJob(
        str(out), start, algo, "rp5", SCENE.model_dump(), SIM.model_dump(), cfg.model_dump(), 0
    )


def test_ppo_on_ray_syncs_weights_and_replaces_a_dead_worker(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    import ray

    checks: list[bool] = []

    def on_iteration(run: RLRun) -> None:
        if run.iteration == 1:
            ray.kill(run.workers[0])  # its next rollout fails: replaced, training goes on
        if run.iteration == 3:
            learner = ray.get(run.learner.weights.remote())
            for w in run.workers:
                theirs = ray.get(w.weights.remote())
                checks.append(all(np.array_equal(learner[n], theirs[n]) for n in learner))

    final = train_rl(job(start, tmp_path, "ppo", sync_dtype="float32"), on_iteration=on_iteration)
    assert checks == [True, True], "after a sync every worker holds the learner's parameters"
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert records[-1]["replacements"] == 1
    assert records[0]["sync_bytes"] < records[0]["full_model_bytes"]
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


def test_sac_learner_killed_then_rerun_resumes_from_its_checkpoint(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    import ray

    def kill_learner(run: RLRun) -> None:
        if run.iteration == 3:
            ray.kill(run.learner)

    with pytest.raises(LearnerLost, match="re-run to resume"):
        train_rl(job(start, tmp_path, "sac"), on_iteration=kill_learner)
    assert (tmp_path / "step-0000002").is_dir() and not (tmp_path / "step-0000004").exists()
    final = train_rl(job(start, tmp_path, "sac"))
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3, 3, 4], "the re-run continued after iteration 2, not from scratch"
    assert final.name == "step-0000004"
    state = json.loads((final / "training" / "state.json").read_text())
    assert state["step"] == 4 and state["algo"]["updates"] > 0


def test_asking_for_more_cpus_than_the_cluster_has_is_named(
    start: str, tmp_path: Path, ray_local: None
) -> None:
    with pytest.raises(ValueError, match=r"asks for 4.5 CPUs .* cluster has 2"):
        train_rl(job(start, tmp_path, "ppo", workers=4, worker_cpus=1.0))
