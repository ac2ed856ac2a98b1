"""PPO for the VLA: clipped objective, GAE on a value head, entropy bonus, KL to the start policy.

One update, on the rollouts of every worker (``T`` decisions x ``N`` environments)::

    recorded by the workers while playing (the learner runs no forward pass without gradients):
              V(obs[0..T]) from their synced copy of the value head
              the frozen start policy's means on obs[0..T-1] (when kl_coef > 0)
    advantages, returns = gae(rewards, V, terminated, truncated, gamma ** horizon, lambda)
    for each epoch, for each minibatch of decisions:
        ratio  = exp(log pi(a|s) - log pi_old(a|s))
        loss   = -mean(min(ratio * A, clip(ratio, 1 +- clip) * A))          clipped objective
                 + value_coef * mean((V(s) - R)^2)                           value head
                 - entropy_coef * mean(H[pi(.|s)])                           entropy bonus
                 + kl_coef * mean(KL(pi(.|s) || pi_start(.|s)))              stay near BC

The policy's log-std is state-independent, so its entropy is a function of ``log_std`` alone.
The value head reads the policy's features detached: the value loss never pulls on the
adapters, so a poor value estimate cannot damage what BC taught.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch
from torch import nn
from torch.distributions import kl_divergence

from stages.finetune.algorithm import RLAlgorithm
from stages.finetune.config import PPOConfig
from stages.finetune.heads import ValueHead
from stages.finetune.rollout import chunk_distribution, pooled_features
from stages.finetune.rounds import Rollout, flatten_observations
from stages.policy.base import VLAPolicy


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation over ``(T, N)`` arrays; ``values`` is ``(T + 1, N)``.

    A solved episode bootstraps nothing. A truncated one lost its final observation to the
    autoreset, so it bootstraps from the value of the decision's own state, the closest
    estimate there is. Returns (advantages, returns), float32 ``(T, N)``.
    """
    steps = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    running = np.zeros(rewards.shape[1], np.float32)
    for t in reversed(range(steps)):
        ended = terminated[t] | truncated[t]
        next_value = np.where(terminated[t], 0.0, np.where(truncated[t], values[t], values[t + 1]))
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * np.where(ended, 0.0, running)
        advantages[t] = running
    return advantages, (advantages + values[:steps]).astype(np.float32)


def clipped_objective(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    clip: float,
    clip_high: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate loss (to minimise) and the fraction of clipped ratios. The
    ratio is clipped to ``[1 - clip, 1 + clip_high]`` (``clip_high`` defaults to ``clip``)."""
    high = clip if clip_high is None else clip_high
    ratio = (logp - old_logp).exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip, 1.0 + high) * advantages
    loss = -torch.minimum(unclipped, clipped).mean()
    return loss, ((ratio < 1.0 - clip) | (ratio > 1.0 + high)).float().mean()


def minibatches(
    indices: np.ndarray, size: int, epochs: int, rng: np.random.Generator
) -> Iterator[np.ndarray]:
    """``epochs`` passes over ``indices``, each shuffled and split into minibatches of about
    ``size`` (at least one per pass)."""
    for _ in range(epochs):
        yield from np.array_split(rng.permutation(indices), max(1, len(indices) // size))


class PPO(RLAlgorithm):
    """The PPO learner state: value head and one Adam over adapters, heads and value head."""

    on_policy = True
    value_head = True
    loss_metrics = ("policy_loss", "value_loss", "kl_ref")

    def __init__(
        self,
        policy: VLAPolicy,
        reference: VLAPolicy,
        params: dict[str, nn.Parameter],
        cfg: PPOConfig,
        gamma: float,
        horizon: int,
        seed: int,
    ) -> None:
        self.policy, self.reference, self.params, self.cfg = policy, reference, params, cfg
        self.gamma, self.horizon = gamma, horizon
        self.value = ValueHead(policy.action_head.in_features)
        self.optimizer = torch.optim.Adam(
            [
                {"params": list(params.values()), "lr": cfg.lr},
                {"params": list(self.value.parameters()), "lr": cfg.value_lr},
            ]
        )
        self.rng = np.random.default_rng(seed)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.optimizer}

    def modules(self) -> dict[str, nn.Module]:
        """What a learner checkpoint saves besides the policy."""
        return {"value": self.value}

    def acting_modules(self) -> dict[str, nn.Module]:
        """The value head: the workers value the states they visit with a synced copy."""
        return {"value": self.value}

    def advantages(self, batch: Rollout, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GAE over the round's decisions, ``values`` ``(T + 1, N)``: a decision spans
        ``horizon`` control steps (its reward is already discounted inside the chunk), so
        consecutive decisions are ``gamma ** horizon`` apart. Returns (advantages, returns)."""
        return gae(
            batch.reward,
            values,
            batch.terminated,
            batch.truncated,
            self.gamma**self.horizon,
            self.cfg.gae_lambda,
        )

    def update(self, batch: Rollout) -> dict[str, float]:
        if batch.value is None:
            raise ValueError("PPO needs the workers' state values (a worker with value_head)")
        if self.cfg.kl_coef > 0 and batch.ref_mean is None:
            raise ValueError("kl_coef > 0 needs the start policy's means (a kl_anchor worker)")
        steps, envs = batch.reward.shape
        values = batch.value
        advantages, returns = self.advantages(batch, values)
        decisions = np.arange(steps * envs)
        ref_mean = (
            torch.as_tensor(batch.ref_mean.reshape(steps * envs, *batch.ref_mean.shape[2:]))
            if batch.ref_mean is not None
            else None
        )
        ref_log_std = self.reference.log_std.detach()
        flat = flatten_observations(batch)
        actions = torch.as_tensor(batch.actions.reshape(steps * envs, *batch.actions.shape[2:]))
        old_logp = torch.as_tensor(batch.logp.reshape(-1))
        adv = torch.as_tensor(advantages.reshape(-1))
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        ret = torch.as_tensor(returns.reshape(-1))
        sums: dict[str, float] = {}
        count = 0
        for mb in minibatches(decisions, self.cfg.minibatch_size, self.cfg.epochs, self.rng):
            index = torch.as_tensor(mb)
            obs = flat.observations(mb)
            out = self.policy(**obs)
            dist = chunk_distribution(out, self.horizon, obs.get("prefix_mask"))
            logp = dist.log_prob(actions[index]).sum(dim=(1, 2))
            policy_loss, clip_frac = clipped_objective(
                logp, old_logp[index], adv[index], self.cfg.clip
            )
            value_loss = ((self.value(pooled_features(out)) - ret[index]) ** 2).mean()
            entropy = dist.entropy().sum(dim=(1, 2)).mean()
            kl_ref = torch.zeros(())
            if ref_mean is not None:
                ref = torch.distributions.Normal(
                    ref_mean[index], ref_log_std.exp().expand_as(ref_mean[index])
                )
                kl_ref = kl_divergence(dist, ref).sum(dim=(1, 2)).mean()
            loss = (
                policy_loss
                + self.cfg.value_coef * value_loss
                - self.cfg.entropy_coef * entropy
                + self.cfg.kl_coef * kl_ref
            )
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)
            nn.utils.clip_grad_norm_(list(self.value.parameters()), 1.0)
            self.optimizer.step()
            with torch.no_grad():
                approx_kl = (old_logp[index] - logp).exp() - 1 - (old_logp[index] - logp)
            for key, value in (
                ("policy_loss", policy_loss.item()),
                ("value_loss", value_loss.item()),
                ("entropy", entropy.item()),
                ("kl_ref", kl_ref.item()),
                ("approx_kl", approx_kl.mean().item()),
                ("clip_frac", clip_frac.item()),
                ("grad_norm", grad_norm.item()),
            ):
                sums[key] = sums.get(key, 0.0) + value
            count += 1
        metrics = {k: v / count for k, v in sums.items()}
        explained = 1.0 - np.var(returns - values[:steps]) / (np.var(returns) + 1e-8)
        metrics.update(updates=float(count), explained_variance=float(explained))
        return metrics
