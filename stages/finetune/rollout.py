"""Rollout workers for RL fine-tuning: a batched simulator plus a policy copy in inference mode.

Each worker (a Ray actor, see :mod:`stages.finetune.rl`) plays in one of two ways:

- ``rollout`` (PPO, SAC): its environments keep running across rounds (autoreset); each round
  is ``T`` decisions of ``N`` environments (:class:`Rollout`).
- ``play_groups`` (GRPO): whole episodes from given reset seeds, each seed ``group_size`` times
  (:class:`GroupRollout`); every episode starts at a reset and ends solved or timed out.

A call carries the synced weights it is to play with, so a worker that Ray restarted (from its
constructor: the start policy) plays the call it runs again with them. Per control decision it
samples an action chunk from the policy's Gaussian, executes the first ``horizon`` actions (one
by default, as evaluation and the edge runtime do), and records what the learner needs. So that
the learner never runs the policy without gradients, the worker also records what it would
otherwise recompute: the frozen start policy's means (the KL anchor) when the algorithm uses
one, and PPO's state values from a synced copy of the value head. Rewards are computed here
from the scene config's reward terms (:meth:`sim_scenes.config.SceneConfig.reward_terms`), not
taken from the simulator.

RL works in the policy's *normalised* action units (the Gaussian's own space): log-probabilities,
KL terms and the critics' inputs are then independent of the robot's joint ranges.
"""

from __future__ import annotations

import os
import time
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np
import torch
from torch.distributions import Normal

from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedObservation
from sim_scenes.config import SceneConfig, SimConfig
from sim_scenes.episodes import play_episodes
from stages.finetune.heads import ValueHead
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


def chunk_distribution(out: PolicyOutput, horizon: int) -> Normal:
    """The Gaussian over the executed prefix of the action chunk, normalised units, batch
    shape ``(B, horizon, action_dim)``."""
    mean = out.mean[:, :horizon]
    return Normal(mean, out.log_std.exp().expand_as(mean))


def pooled_features(out: PolicyOutput) -> torch.Tensor:
    """One feature vector per observation for value and Q heads: the action queries' features
    averaged, ``(B, d)``, detached (critics learn on the policy's representation without
    pulling on it)."""
    return out.features.mean(dim=1).detach()


@dataclass
class PlayedRound:
    """What a rollout worker played in one round, as the learner trains on it: the observations
    its decisions were taken in (the policy's inputs, :meth:`observations`), the sampled
    actions and their log-probabilities. The arrays share the round's leading axes ``B``:
    :class:`Rollout` ``(T + 1, N)`` for observations and ``(T, N)`` for decisions;
    :class:`GroupRollout` ``(M,)`` for both."""

    images: dict[str, np.ndarray]
    """camera -> uint8 ``(*B, H, W, 3)``."""
    state: np.ndarray
    """float32 ``(*B, state_dim)``, robot units."""
    tokens: np.ndarray
    """int64 ``(*B, max_tokens)``."""
    token_mask: np.ndarray
    """int64 ``(*B, max_tokens)``."""
    actions: np.ndarray
    """float32 ``(*B, horizon, action_dim)``, normalised units (groups: horizon 1)."""
    logp: np.ndarray
    """float32 ``(*B,)``: log-probability of ``actions`` under the worker's policy."""
    _: KW_ONLY
    ref_mean: np.ndarray | None = None
    """float32, shaped like ``actions``: the start policy's mean at each decision (normalised
    units), when the workers record the KL anchor."""
    env_steps: int = 0
    """Control steps simulated (a :class:`Rollout`'s ``T * N * horizon``)."""
    weights_version: int = 0
    """Which synced weights acted."""
    seconds: dict[str, float] = field(default_factory=dict)
    """``simulate`` and ``inference`` time of the round."""
    pid: int = 0
    """The process that played it (a pool notices a restarted worker by it)."""

    def observations(self, index: Any) -> dict[str, Any]:
        """Keyword arguments of :meth:`VLAPolicy.forward` for the observations ``index`` (any
        numpy index over the leading axes), as tensors."""
        return {
            "images": {c: torch.as_tensor(v[index]) for c, v in self.images.items()},
            "state": torch.as_tensor(self.state[index]),
            "tokens": torch.as_tensor(self.tokens[index]),
            "token_mask": torch.as_tensor(self.token_mask[index]),
        }


@dataclass
class Rollout(PlayedRound):
    """One worker's round, time-major: ``T`` decisions of ``N`` environments.

    Observations have ``T + 1`` entries: decision ``t`` was taken in ``obs[t]`` and led to
    ``obs[t + 1]`` (the next episode's first observation where ``done[t]``).
    """

    reward: np.ndarray
    """float32 ``(T, N)``: discounted reward over the executed actions."""
    terminated: np.ndarray
    """bool ``(T, N)``: the episode was solved (nothing to bootstrap)."""
    truncated: np.ndarray
    """bool ``(T, N)``: the episode hit its step limit."""
    value: np.ndarray | None = None
    """float32 ``(T + 1, N)``: the synced value head's estimate of each observation (PPO)."""
    success: list[bool] = field(default_factory=list)
    """Episodes that finished during the round: solved or not."""
    episode_return: list[float] = field(default_factory=list)


@dataclass
class GroupRollout(PlayedRound):
    """One worker's round of groups: whole episodes in groups that share a reset seed, every
    decision flat (``M`` decisions of ``E`` episodes)."""

    episode: np.ndarray
    """int64 ``(M,)``: which episode (index into ``success``) each decision belongs to."""
    group: np.ndarray
    """int64 ``(E,)``: each episode's group (the episodes of one group share a reset seed)."""
    success: np.ndarray
    """bool ``(E,)``: each episode was solved."""
    episode_return: np.ndarray
    """float32 ``(E,)``: each episode's undiscounted return."""


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
        cfg = self.policy.cfg
        self.scene = scene.model_copy(
            update={"cameras": list(cfg.cameras), "image_size": cfg.image_size}
        )
        self.rewards = self.scene.reward_terms()
        self.env = make_env(
            get_robot(robot),
            self.scene,
            sim.model_copy(update={"num_threads": threads}),
            num_envs=num_envs,
            autoreset=not episodic,
        )
        self.horizon, self.gamma = horizon, gamma
        rng = np.random.default_rng([seed, worker_id])
        self.obs = self.env.reset([int(s) for s in rng.integers(0, 2**31 - 1, num_envs)])
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

    def _act(self, obs: BatchedObservation) -> dict[str, torch.Tensor]:
        """One decision in every environment: the sampled chunk prefix (normalised), its
        log-probability, the value of ``obs`` and the start policy's mean (when kept)."""
        with torch.inference_mode():
            inputs = self.policy.model_inputs(obs)
            out = self.policy(**inputs)
            dist = chunk_distribution(out, self.horizon)
            action = dist.sample()
            decision = {"action": action, "logp": dist.log_prob(action).sum(dim=(1, 2))}
            if self.value is not None:
                decision["value"] = self.value(pooled_features(out))
            if self.reference is not None:
                decision["ref_mean"] = self.reference(**inputs).mean[:, : self.horizon]
        return decision

    def _value(self, obs: BatchedObservation) -> np.ndarray:
        """The synced value head's estimate of ``obs``, float32 ``(N,)``."""
        assert self.value is not None
        with torch.inference_mode():
            out = self.policy(**self.policy.model_inputs(obs))
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
            decision = self._act(self.obs)
            action = decision["action"]
            robot_units = self.policy.denormalize_actions(action).numpy()
            inference += time.perf_counter() - tick
            step_rewards, step_terminated, step_truncated = [], [], []
            for k in range(self.horizon):
                result = self.env.step(robot_units[:, k])
                step_rewards.append(
                    self.rewards(
                        result.success,
                        result.info["tcp_target_distance"],
                        result.info["tcp_target_distance_before"],
                    )
                )
                step_terminated.append(result.terminated)
                step_truncated.append(result.truncated)
                success += [bool(s) for s in result.final.success]
                returns += [float(x) for x in result.final.episode_return]
            reward, solved, cut = chunk_transition(
                np.stack(step_rewards),
                np.stack(step_terminated),
                np.stack(step_truncated),
                self.gamma,
            )
            self.obs = result.obs
            obs_list.append(self.obs)
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
            values.append(self._value(self.obs))
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
            k: [] for k in ("images", "state", "instruction", "action", "logp", "ref", "episode")
        }
        inference = 0.0
        decision: dict[str, torch.Tensor] = {}
        before = dict(self.env.timings)

        def act(_: Any, obs: BatchedObservation) -> np.ndarray:
            nonlocal inference, decision
            tick = time.perf_counter()
            decision = self._act(obs)
            robot_units = self.policy.denormalize_actions(decision["action"]).numpy()
            inference += time.perf_counter() - tick
            return robot_units[:, 0]

        def record(slots: list[int], obs: BatchedObservation, *_: Any) -> None:
            playing = [e for e, i in enumerate(slots) if i >= 0]  # idle environments: no
            records["images"].append({c: v[playing] for c, v in obs.images.items()})
            records["state"].append(obs.state[playing])
            records["instruction"] += [obs.instruction[e] for e in playing]
            records["action"].append(decision["action"].numpy()[playing])
            records["logp"].append(decision["logp"].numpy()[playing])
            if "ref_mean" in decision:
                records["ref"].append(decision["ref_mean"].numpy()[playing])
            records["episode"] += [slots[e] for e in playing]

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
            env_steps=sum(e.length for e in episodes),
            weights_version=self.version,
            seconds=seconds,
            pid=os.getpid(),
        )

    def close(self) -> None:
        self.env.close()


def _joined(arrays: list[np.ndarray | None], axis: int) -> np.ndarray | None:
    """``arrays`` concatenated along ``axis``; None when a worker recorded none."""
    present = [a for a in arrays if a is not None]
    return np.concatenate(present, axis=axis) if len(present) == len(arrays) else None


def concat_groups(rollouts: list[GroupRollout]) -> GroupRollout:
    """Workers' group rounds as one: decisions concatenated, episode and group numbers made
    unique across workers."""
    episode_offsets = np.cumsum([0] + [len(r.success) for r in rollouts])
    group_offsets = np.cumsum(
        [0] + [int(r.group.max()) + 1 if len(r.group) else 0 for r in rollouts]
    )
    return GroupRollout(
        images={c: np.concatenate([r.images[c] for r in rollouts]) for c in rollouts[0].images},
        state=np.concatenate([r.state for r in rollouts]),
        tokens=np.concatenate([r.tokens for r in rollouts]),
        token_mask=np.concatenate([r.token_mask for r in rollouts]),
        actions=np.concatenate([r.actions for r in rollouts]),
        logp=np.concatenate([r.logp for r in rollouts]),
        episode=np.concatenate(
            [r.episode + o for r, o in zip(rollouts, episode_offsets, strict=False)]
        ),
        group=np.concatenate([r.group + o for r, o in zip(rollouts, group_offsets, strict=False)]),
        success=np.concatenate([r.success for r in rollouts]),
        episode_return=np.concatenate([r.episode_return for r in rollouts]),
        ref_mean=_joined([r.ref_mean for r in rollouts], axis=0),
        env_steps=sum(r.env_steps for r in rollouts),
        weights_version=min(r.weights_version for r in rollouts),
        seconds={k: max(r.seconds.get(k, 0.0) for r in rollouts) for k in rollouts[0].seconds},
    )


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Workers' rounds side by side: environments concatenated along axis 1."""

    def cat(arrays: list[np.ndarray]) -> np.ndarray:
        return np.concatenate(arrays, axis=1)

    first = rollouts[0]
    return Rollout(
        images={c: cat([r.images[c] for r in rollouts]) for c in first.images},
        state=cat([r.state for r in rollouts]),
        tokens=cat([r.tokens for r in rollouts]),
        token_mask=cat([r.token_mask for r in rollouts]),
        actions=cat([r.actions for r in rollouts]),
        logp=cat([r.logp for r in rollouts]),
        reward=cat([r.reward for r in rollouts]),
        terminated=cat([r.terminated for r in rollouts]),
        truncated=cat([r.truncated for r in rollouts]),
        value=_joined([r.value for r in rollouts], axis=1),
        ref_mean=_joined([r.ref_mean for r in rollouts], axis=1),
        success=[s for r in rollouts for s in r.success],
        episode_return=[x for r in rollouts for x in r.episode_return],
        env_steps=sum(r.env_steps for r in rollouts),
        weights_version=min(r.weights_version for r in rollouts),
        seconds={k: max(r.seconds.get(k, 0.0) for r in rollouts) for k in first.seconds},
    )


def flatten_observations(rollout: Rollout) -> Rollout:
    """A view of ``rollout`` whose observations have one leading axis (``(T + 1) * N``)."""

    def flat(a: np.ndarray) -> np.ndarray:
        return a.reshape(-1, *a.shape[2:])

    return Rollout(
        images={c: flat(v) for c, v in rollout.images.items()},
        state=flat(rollout.state),
        tokens=flat(rollout.tokens),
        token_mask=flat(rollout.token_mask),
        actions=rollout.actions,
        logp=rollout.logp,
        reward=rollout.reward,
        terminated=rollout.terminated,
        truncated=rollout.truncated,
    )
