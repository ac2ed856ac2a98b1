"""Rollout workers for RL fine-tuning: a batched simulator plus a policy copy in inference mode.

Each worker (a Ray actor, see :mod:`stages.finetune.rl`) plays in one of two ways:

- ``rollout`` (PPO, SAC): its environments keep running across rounds (autoreset); each round
  is ``T`` decisions of ``N`` environments (a :class:`~stages.finetune.rounds.Rollout`).
- ``play_groups`` (GRPO): whole episodes from given reset seeds, each seed ``group_size``
  times (a :class:`~stages.finetune.rounds.GroupRollout`); every episode starts at a reset and
  ends solved or timed out.

A call carries the synced weights it is to play with, so a worker that Ray restarted (from its
constructor: the start policy) plays the call it runs again with them. Per control decision it
samples an action chunk from the policy's Gaussian, executes the first ``horizon`` actions (one
by default, as evaluation and the edge runtime do), and records what the learner needs. So that
the learner never runs the policy without gradients, the worker also records what it would
otherwise recompute: the frozen start policy's means (the KL anchor) when the algorithm uses
one, and PPO's state values from a synced copy of the value head. Rewards are the simulator's
own, for the task it plays with the scene config's RL reward applied
(:meth:`sim_scenes.config.SceneConfig.rl_task`): whatever the task family, RL reads
``StepResult.reward``.

RL works in the policy's *normalised* action units (the Gaussian's own space): log-probabilities,
KL terms and the critics' inputs are then independent of the robot's joint ranges.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import torch
from torch.distributions import Normal

from robots.spec import get_robot
from sim_scenes.backends import open_env
from sim_scenes.batched_env import BatchedObservation, StepResult
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.episodes import play_episodes
from stages.finetune.committed import CommittedActions
from stages.finetune.heads import ValueHead
from stages.finetune.rounds import GroupRollout, Rollout
from stages.policy.base import PolicyOutput, VLAPolicy
from stages.policy.checkpoint import load_policy
from stages.worker_pool import PoolWorker, Ready

SYNC_EXCLUDE = ("target_head",)
"""Trainable tensors RL neither trains nor sends: the auxiliary head only shapes BC."""
VALUE_PREFIX = "value/"
"""Synced weights under this prefix are the value head's (PPO), not the policy's."""


def rl_parameters(policy: VLAPolicy) -> dict[str, torch.nn.Parameter]:
    """The parameters RL trains and synchronises: LoRA adapters (or everything, for a full
    fine-tune), the action head and log-std -- the checkpoint's tensors minus the auxiliary
    head."""
    return {
        n: p
        for n, p in policy.named_parameters()
        if p.requires_grad and n.split(".")[0] not in SYNC_EXCLUDE
    }


def decision_mean(
    out: PolicyOutput, horizon: int, prefix_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The chunk's mean over a decision's actions, ``(B, horizon, action_dim)`` normalised:
    its first ``horizon`` positions, or with ``prefix_mask`` ``(B, chunk_len)`` (the committed
    prefix the policy was given, :mod:`stages.finetune.committed`) the ``horizon`` after each
    sample's committed ones."""
    if prefix_mask is None:
        return out.mean[:, :horizon]
    start = prefix_mask.sum(dim=1).round().long()
    positions = start[:, None] + torch.arange(horizon, device=start.device)[None, :]
    index = positions[..., None].expand(-1, -1, out.mean.shape[-1])
    return out.mean.gather(1, index)


def chunk_distribution(
    out: PolicyOutput, horizon: int, prefix_mask: torch.Tensor | None = None
) -> Normal:
    """The Gaussian over a decision's actions (:func:`decision_mean`), normalised units,
    batch shape ``(B, horizon, action_dim)``."""
    mean = decision_mean(out, horizon, prefix_mask)
    return Normal(mean, out.log_std.exp().expand_as(mean))


def pooled_features(out: PolicyOutput) -> torch.Tensor:
    """One feature vector per observation for value and Q heads: the action queries' features
    averaged, ``(B, d)``, detached (critics learn on the policy's representation without
    pulling on it)."""
    return out.features.mean(dim=1).detach()


def chunk_transition(
    rewards: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, gamma: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One decision's transition from the ``horizon`` control steps its action chunk ran.

    ``rewards``, ``terminated``, ``truncated``: ``(horizon, N)`` per control step. Returns the
    decision's reward ``sum_k gamma^k r_k`` float32 ``(N,)`` over the steps up to and including
    the one where the episode ended, whether it was solved (bool ``(N,)``), and whether it was
    cut by the step limit instead (bool ``(N,)``). An environment that finished earlier in the
    chunk is already in its next episode: what happens there belongs to no transition of this
    decision. The learner discounts across decisions by ``gamma ** horizon``.
    """
    steps, envs = rewards.shape
    reward = np.zeros(envs, np.float32)
    solved = np.zeros(envs, bool)
    ended = np.zeros(envs, bool)
    for k in range(steps):
        reward += np.where(ended, 0.0, gamma**k * rewards[k])  # stays float32
        solved |= terminated[k] & ~ended
        ended |= terminated[k] | truncated[k]
    return reward, solved, ended & ~solved


class RolloutWorker(PoolWorker):
    """Environments of the scene's training variant plus a policy copy (no optimizer)."""

    def __init__(
        self,
        checkpoint: str,
        robot: str,
        scene: SceneConfig,
        sim: SimConfig,
        num_envs: int,
        horizon: int,
        gamma: float,
        seed: int,
        worker_id: int,
        threads: int = 1,
        kl_anchor: bool = False,
        value_head: bool = False,
        episodic: bool = False,
    ) -> None:
        """``kl_anchor``: also record the start policy's means; ``value_head``: run a synced
        value head (PPO); ``episodic``: play whole episodes from given seeds (GRPO's
        :meth:`play_groups`) instead of running environments across rounds."""
        torch.set_num_threads(threads)
        # Action noise and episode seeds: a function of (seed, worker_id), the same every run.
        torch.manual_seed(int(np.random.SeedSequence([seed, worker_id]).generate_state(1)[0]))
        self.policy = load_policy(checkpoint).eval()
        self.params = rl_parameters(self.policy)
        self.reference = load_policy(checkpoint).eval() if kl_anchor else None
        width = self.policy.action_head.in_features
        self.value = ValueHead(width).eval() if value_head else None
        cfg, self.spec = self.policy.cfg, get_robot(robot)
        self.scene = scene.model_copy(
            update={"cameras": list(cfg.cameras), "image_size": cfg.image_size}
        )
        self.env = open_env(
            self.spec,
            self.scene.rl_task(),
            sim.model_copy(update={"num_threads": threads}),
            num_envs=num_envs,
            cameras=tuple(self.scene.cameras),
            image_size=self.scene.image_size,
            autoreset=not episodic,
        )
        self.horizon, self.gamma = horizon, gamma
        self.rng = np.random.default_rng([seed, worker_id])
        """Episode seeds, then (a delay-conditioned policy) the delays episodes play."""
        self.obs = self.env.reset([int(s) for s in self.rng.integers(0, 2**31 - 1, num_envs)])
        self.committed = (
            CommittedActions(
                self.spec, num_envs, cfg.chunk_len, horizon, cfg.prefix_ticks, self.rng
            )
            if cfg.prefix_ticks and not episodic
            else None
        )
        """A delay-conditioned policy's rollouts play delays (:mod:`stages.finetune.committed`);
        GRPO's episodes (:meth:`play_groups`) keep theirs per call."""
        if self.committed is not None:
            self.committed.restart(range(num_envs), self.obs.state)
        self.version = -1
        """Which synced weights it holds; -1: none yet (the start checkpoint's own)."""

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> Ready:
        """Load synced trainable parameters (any float dtype) in place; names under
        :data:`VALUE_PREFIX` go to the value head."""
        value = dict(self.value.named_parameters()) if self.value is not None else {}
        with torch.no_grad():
            for name, array in weights.items():
                if name.startswith(VALUE_PREFIX):
                    value[name.removeprefix(VALUE_PREFIX)].copy_(torch.from_numpy(array))
                else:
                    self.params[name].copy_(torch.from_numpy(array))
        self.version = version
        return Ready(os.getpid())

    def _inputs(self, obs: BatchedObservation, committed: dict[str, np.ndarray]) -> dict[str, Any]:
        """The policy's keyword arguments for ``obs`` and the ``committed`` prefix (empty: no
        delay)."""
        inputs = self.policy.model_inputs(obs)
        return inputs | {k: torch.as_tensor(v) for k, v in committed.items()}

    def _act(
        self, obs: BatchedObservation, committed: dict[str, np.ndarray] | None = None
    ) -> dict[str, torch.Tensor]:
        """One decision in every environment: its sampled actions (normalised; the chunk's
        first ``horizon``, or the ``horizon`` after the ``committed`` prefix), their
        log-probability, the value of ``obs`` and the start policy's mean (when kept)."""
        with torch.inference_mode():
            inputs = self._inputs(obs, committed or {})
            mask = inputs.get("prefix_mask")
            out = self.policy(**inputs)
            dist = chunk_distribution(out, self.horizon, mask)
            action = dist.sample()
            decision = {"action": action, "logp": dist.log_prob(action).sum(dim=(1, 2))}
            if self.value is not None:
                decision["value"] = self.value(pooled_features(out))
            if self.reference is not None:
                decision["ref_mean"] = decision_mean(self.reference(**inputs), self.horizon, mask)
        return decision

    def _value(self, obs: BatchedObservation, committed: dict[str, np.ndarray]) -> np.ndarray:
        """The synced value head's estimate of ``obs`` with its ``committed`` prefix, float32
        ``(N,)``."""
        assert self.value is not None
        with torch.inference_mode():
            out = self.policy(**self._inputs(obs, committed))
            return self.value(pooled_features(out)).numpy()

    def weights(self) -> dict[str, np.ndarray]:
        """What it acts with as it is now, named as synced (tests compare it with the
        learner's)."""
        held = {n: p.detach().numpy().copy() for n, p in self.params.items()}
        if self.value is not None:
            for n, p in self.value.named_parameters():
                held[VALUE_PREFIX + n] = p.detach().numpy().copy()
        return held

    def rollout(
        self, steps: int, weights: dict[str, np.ndarray] | None = None, version: int = 0
    ) -> Rollout:
        """Take ``steps`` decisions in every environment, continuing the running episodes.

        With ``weights``: play with these synced weights (``version``), loaded first unless
        they are the ones held. The driver always passes them: Ray may run the call again on a
        restarted worker, which holds none, and retried calls may run out of order.
        """
        if weights is not None and version != self.version:
            self.set_weights(weights, version)
        obs_list: list[BatchedObservation] = [self.obs]
        prefixes = [self.committed.prefix()] if self.committed is not None else []
        actions, logps, values, ref_means = [], [], [], []
        rewards, terminated, truncated = [], [], []
        success: list[bool] = []
        returns: list[float] = []
        inference = 0.0
        simulate_before = self.env.timings.get("simulate", 0.0) + self.env.timings.get(
            "render", 0.0
        )
        for _ in range(steps):
            tick = time.perf_counter()
            decision = self._act(self.obs, prefixes[-1] if prefixes else None)
            action = decision["action"]
            robot_units = self.policy.denormalize_actions(action).numpy()
            inference += time.perf_counter() - tick
            if self.committed is not None:  # what executes now was committed d ticks ago
                robot_units = self.committed.commit(robot_units)
            step_rewards, step_terminated, step_truncated = [], [], []
            ended: set[int] = set()
            for k in range(self.horizon):
                result = self.env.step(robot_units[:, k])
                step_rewards.append(result.reward)
                step_terminated.append(result.terminated)
                step_truncated.append(result.truncated)
                success += [bool(s) for s in result.final.success]
                returns += [float(x) for x in result.final.episode_return]
                ended |= {int(e) for e in result.final.env_ids}
            reward, solved, cut = chunk_transition(
                np.stack(step_rewards),
                np.stack(step_terminated),
                np.stack(step_truncated),
                self.gamma,
            )
            self.obs = result.obs
            obs_list.append(self.obs)
            if self.committed is not None:  # a new episode: its own delay, nothing committed
                self.committed.restart(sorted(ended), self.obs.state)
                prefixes.append(self.committed.prefix())
            actions.append(action.numpy())
            logps.append(decision["logp"].numpy())
            if "value" in decision:
                values.append(decision["value"].numpy())
            if "ref_mean" in decision:
                ref_means.append(decision["ref_mean"].numpy())
            rewards.append(reward)
            terminated.append(solved)
            truncated.append(cut)
        if self.value is not None:  # the last observation's value bootstraps the round
            tick = time.perf_counter()
            values.append(self._value(self.obs, prefixes[-1] if prefixes else {}))
            inference += time.perf_counter() - tick
        simulate = (
            self.env.timings.get("simulate", 0.0)
            + self.env.timings.get("render", 0.0)
            - simulate_before
        )
        tokenized = [self.policy.tokenizer(list(o.instruction)) for o in obs_list]
        return Rollout(
            images={c: np.stack([o.images[c] for o in obs_list]) for c in self.scene.cameras},
            state=np.stack([o.state for o in obs_list]).astype(np.float32),
            tokens=np.stack([t for t, _ in tokenized]),
            token_mask=np.stack([m for _, m in tokenized]),
            actions=np.stack(actions).astype(np.float32),
            logp=np.stack(logps).astype(np.float32),
            reward=np.stack(rewards),
            terminated=np.stack(terminated),
            truncated=np.stack(truncated),
            value=np.stack(values).astype(np.float32) if values else None,
            ref_mean=np.stack(ref_means).astype(np.float32) if ref_means else None,
            prefix=np.stack([p["prefix"] for p in prefixes]) if prefixes else None,
            prefix_mask=np.stack([p["prefix_mask"] for p in prefixes]) if prefixes else None,
            success=success,
            episode_return=returns,
            env_steps=steps * self.env.num_envs * self.horizon,
            weights_version=self.version,
            seconds={"simulate": simulate, "inference": inference},
            pid=os.getpid(),
        )

    def play_groups(
        self,
        seeds: list[int],
        group_size: int,
        weights: dict[str, np.ndarray] | None = None,
        version: int = 0,
    ) -> GroupRollout:
        """Play each reset seed ``group_size`` times, one whole episode each (GRPO), with the
        synced ``weights`` (see :meth:`rollout`). The environments take the next pending
        episode as soon as theirs ends; a decision's record is its observation, sampled action
        and log-probability. Needs a worker built with ``episodic=True``."""
        if weights is not None and version != self.version:
            self.set_weights(weights, version)
        episode_seeds = [s for s in seeds for _ in range(group_size)]
        records: dict[str, list[Any]] = {
            k: []
            for k in (
                *("images", "state", "instruction", "action", "logp", "ref", "episode"),
                *("prefix", "prefix_mask"),
            )
        }
        inference = 0.0
        decision: dict[str, torch.Tensor] = {}
        before = dict(self.env.timings)
        cfg, n = self.policy.cfg, self.env.num_envs
        committed = (  # a delay-conditioned policy plays delays (stages.finetune.committed)
            CommittedActions(self.spec, n, cfg.chunk_len, 1, cfg.prefix_ticks, self.rng)
            if cfg.prefix_ticks
            else None
        )
        starting = set(range(self.env.num_envs))
        """Environments whose next decision is their episode's first."""
        given: dict[str, np.ndarray] = {}

        def act(_: Any, obs: BatchedObservation) -> np.ndarray:
            nonlocal inference, decision, given
            if committed is not None:
                committed.restart(sorted(starting), obs.state)
                starting.clear()
                given = committed.prefix()
            tick = time.perf_counter()
            decision = self._act(obs, given)
            robot_units = self.policy.denormalize_actions(decision["action"]).numpy()
            inference += time.perf_counter() - tick
            if committed is not None:
                robot_units = committed.commit(robot_units)
            return robot_units[:, 0]

        def record(
            slots: list[int], obs: BatchedObservation, _: np.ndarray, result: StepResult
        ) -> None:
            playing = [e for e, i in enumerate(slots) if i >= 0]  # idle environments: no
            records["images"].append({c: v[playing] for c, v in obs.images.items()})
            records["state"].append(obs.state[playing])
            records["instruction"] += [obs.instruction[e] for e in playing]
            records["action"].append(decision["action"].numpy()[playing])
            records["logp"].append(decision["logp"].numpy()[playing])
            if "ref_mean" in decision:
                records["ref"].append(decision["ref_mean"].numpy()[playing])
            for key, value in given.items():
                records[key].append(value[playing])
            records["episode"] += [slots[e] for e in playing]
            starting.update(int(e) for e in result.final.env_ids)

        episodes = play_episodes(self.env, act, episode_seeds, on_step=record)
        tokens, mask = self.policy.tokenizer(records["instruction"])
        seconds = {
            "simulate": sum(self.env.timings[k] - before.get(k, 0.0) for k in self.env.timings),
            "inference": inference,
        }
        return GroupRollout(
            images={
                c: np.concatenate([step[c] for step in records["images"]])
                for c in self.scene.cameras
            },
            state=np.concatenate(records["state"]).astype(np.float32),
            tokens=np.asarray(tokens),
            token_mask=np.asarray(mask),
            actions=np.concatenate(records["action"]).astype(np.float32),
            logp=np.concatenate(records["logp"]).astype(np.float32),
            episode=np.asarray(records["episode"], np.int64),
            group=np.arange(len(episodes), dtype=np.int64) // group_size,
            success=np.array([e.success for e in episodes], bool),
            episode_return=np.array([e.episode_return for e in episodes], np.float32),
            ref_mean=np.concatenate(records["ref"]).astype(np.float32) if records["ref"] else None,
            prefix=np.concatenate(records["prefix"]) if records["prefix"] else None,
            prefix_mask=np.concatenate(records["prefix_mask"]) if records["prefix_mask"] else None,
            env_steps=sum(e.length for e in episodes),
            weights_version=self.version,
            seconds=seconds,
            pid=os.getpid(),
        )

    def close(self) -> None:
        self.env.close()
