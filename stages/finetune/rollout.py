"""Rollout workers for RL fine-tuning: a batched simulator plus a policy copy in inference mode.

Each worker (a Ray actor, see :mod:`stages.finetune.rl`) keeps its environments running across
rounds. A rollout call carries the synced weights it is to play with, so a worker that Ray
restarted (from its constructor: the start policy) plays the call it runs again with them. Per
control decision it samples an action chunk from the policy's Gaussian, executes the first
``horizon`` actions (one by default, as evaluation and the edge runtime do), and records what
the learner needs. Rewards are computed here from the scene config's reward terms
(:meth:`sim_scenes.config.SceneConfig.reward_terms`), not taken from the simulator.

RL works in the policy's *normalised* action units (the Gaussian's own space): log-probabilities,
KL terms and the critics' inputs are then independent of the robot's joint ranges.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch.distributions import Normal

from robots.spec import get_robot
from sim_scenes.backends import make_env
from sim_scenes.batched_env import BatchedObservation
from sim_scenes.config import SceneConfig, SimConfig
from stages.policy.base import PolicyOutput, VLAPolicy
from stages.policy.checkpoint import load_policy
from stages.worker_pool import PoolWorker, Ready

SYNC_EXCLUDE = ("target_head",)
"""Trainable tensors RL neither trains nor sends: the auxiliary head only shapes BC."""


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
class Rollout:
    """One worker's round, time-major: ``T`` decisions of ``N`` environments.

    Observations have ``T + 1`` entries: decision ``t`` was taken in ``obs[t]`` and led to
    ``obs[t + 1]`` (the next episode's first observation where ``done[t]``).
    """

    images: dict[str, np.ndarray]
    """camera -> uint8 ``(T + 1, N, H, W, 3)``."""
    state: np.ndarray
    """float32 ``(T + 1, N, state_dim)``, robot units."""
    tokens: np.ndarray
    """int64 ``(T + 1, N, max_tokens)``."""
    token_mask: np.ndarray
    """int64 ``(T + 1, N, max_tokens)``."""
    actions: np.ndarray
    """float32 ``(T, N, horizon, action_dim)``, normalised units."""
    logp: np.ndarray
    """float32 ``(T, N)``: log-probability of ``actions`` under the worker's policy."""
    reward: np.ndarray
    """float32 ``(T, N)``: discounted reward over the executed actions."""
    terminated: np.ndarray
    """bool ``(T, N)``: the episode was solved (nothing to bootstrap)."""
    truncated: np.ndarray
    """bool ``(T, N)``: the episode hit its step limit."""
    success: list[bool] = field(default_factory=list)
    """Episodes that finished during the round: solved or not."""
    episode_return: list[float] = field(default_factory=list)
    env_steps: int = 0
    """Control steps simulated (``T * N * horizon``)."""
    weights_version: int = 0
    """Which synced weights acted."""
    seconds: dict[str, float] = field(default_factory=dict)
    """``simulate`` and ``inference`` time of the round."""
    pid: int = 0
    """The process that played it (a pool notices a restarted worker by it)."""

    def observations(self, index: Any) -> dict[str, Any]:
        """Keyword arguments of :meth:`VLAPolicy.forward` for ``obs[index]`` (any numpy index
        over the leading axes), as tensors."""
        return {
            "images": {c: torch.as_tensor(v[index]) for c, v in self.images.items()},
            "state": torch.as_tensor(self.state[index]),
            "tokens": torch.as_tensor(self.tokens[index]),
            "token_mask": torch.as_tensor(self.token_mask[index]),
        }


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
        scene: dict[str, Any],
        sim: dict[str, Any],
        num_envs: int,
        horizon: int,
        gamma: float,
        seed: int,
        worker_id: int,
        threads: int = 1,
    ) -> None:
        torch.set_num_threads(threads)
        # Action noise and episode seeds: a function of (seed, worker_id), the same every run.
        torch.manual_seed(int(np.random.SeedSequence([seed, worker_id]).generate_state(1)[0]))
        self.policy = load_policy(checkpoint).eval()
        self.params = rl_parameters(self.policy)
        cfg = self.policy.cfg
        self.scene = SceneConfig(**scene).model_copy(
            update={"cameras": list(cfg.cameras), "image_size": cfg.image_size}
        )
        self.rewards = self.scene.reward_terms()
        self.env = make_env(
            get_robot(robot),
            self.scene,
            SimConfig(**sim).model_copy(update={"num_threads": threads}),
            num_envs=num_envs,
        )
        self.horizon, self.gamma = horizon, gamma
        rng = np.random.default_rng([seed, worker_id])
        self.obs = self.env.reset([int(s) for s in rng.integers(0, 2**31 - 1, num_envs)])
        self.version = -1
        """Which synced weights it holds; -1: none yet (the start checkpoint's own)."""

    def set_weights(self, weights: dict[str, np.ndarray], version: int) -> Ready:
        """Load synced trainable parameters (any float dtype) in place."""
        with torch.no_grad():
            for name, array in weights.items():
                self.params[name].copy_(torch.from_numpy(array))
        self.version = version
        return Ready(os.getpid())

    def weights(self) -> dict[str, np.ndarray]:
        """The trainable parameters as they are now (tests compare them with the learner's)."""
        return {n: p.detach().numpy().copy() for n, p in self.params.items()}

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
        actions, logps, rewards, terminated, truncated = [], [], [], [], []
        success: list[bool] = []
        returns: list[float] = []
        inference = 0.0
        simulate_before = self.env.timings.get("simulate", 0.0) + self.env.timings.get(
            "render", 0.0
        )
        for _ in range(steps):
            tick = time.perf_counter()
            with torch.inference_mode():
                out = self.policy(**self.policy.model_inputs(self.obs))
                dist = chunk_distribution(out, self.horizon)
                action = dist.sample()
                logp = dist.log_prob(action).sum(dim=(1, 2))
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
            logps.append(logp.numpy())
            rewards.append(reward)
            terminated.append(solved)
            truncated.append(cut)
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
            success=success,
            episode_return=returns,
            env_steps=steps * self.env.num_envs * self.horizon,
            weights_version=self.version,
            seconds={"simulate": simulate, "inference": inference},
            pid=os.getpid(),
        )

    def close(self) -> None:
        self.env.close()


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
        success=[s for r in rollouts for s in r.success],
        episode_return=[x for r in rollouts for x in r.episode_return],
        env_steps=sum(r.env_steps for r in rollouts),
        weights_version=min(r.weights_version for r in rollouts),
        seconds={k: max(r.seconds.get(k, 0.0) for r in rollouts) for k in first.seconds},
    )


def forward_in_batches(
    policy: VLAPolicy, rollout: Rollout, index: np.ndarray, batch: int = 256
) -> list[PolicyOutput]:
    """Policy outputs for the flat observation indices ``index`` (into ``T + 1`` x ``N``
    flattened), without gradients, ``batch`` at a time."""
    flat = flatten_observations(rollout)
    outputs = []
    with torch.no_grad():
        for start in range(0, len(index), batch):
            outputs.append(policy(**flat.observations(index[start : start + batch])))
    return outputs


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
