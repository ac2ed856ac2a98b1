"""SAC for the VLA: twin Q critics over policy features and the action chunk, target critics,
automatic temperature, and a KL term to the start policy.

One round: the workers' transitions go into the replay buffer (kept in the learner), then
``updates_per_round`` times::

    sample (s, a, r, solved, s') from the buffer             a: executed chunk prefix (h, A)
    y      = r + gamma^h (1 - solved) (min Q_target(s', a') - alpha log pi(a'|s')),  a' ~ pi(.|s')
    critic = (Q1(s, a) - y)^2 + (Q2(s, a) - y)^2
    after critic_warmup updates (a random critic must not steer the BC policy):
        actor = alpha log pi(a~|s) - min Q(s, a~) + kl_coef KL(pi(.|s) || pi_start(.|s)),
                a~ = mean + std * eps (reparameterised)
        alpha: log_alpha descends alpha * (-log pi - target_entropy)
    target critics <- tau * critics + (1 - tau) * target critics

Critics read the policy's features detached (``pooled_features``) and the normalised action
chunk flattened; the actor's gradient reaches the adapters through the Gaussian's mean. A
transition cut by the step limit is not stored: its final observation was replaced by the next
episode's first one, and bootstrapping from that would be wrong.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributions import Normal, kl_divergence

from stages.finetune.algorithm import RLAlgorithm
from stages.finetune.config import SACConfig
from stages.finetune.rollout import chunk_distribution, decision_mean, pooled_features
from stages.finetune.rounds import Rollout
from stages.policy.base import VLAPolicy


class TwinQ(nn.Module):
    """Two critics: features ``(B, d)`` and flattened chunk ``(B, horizon * action_dim)`` ->
    ``(Q1, Q2)``, each ``(B,)``."""

    def __init__(self, width: int, action_size: int, hidden: int = 256) -> None:
        super().__init__()

        def critic() -> nn.Sequential:
            return nn.Sequential(
                nn.Linear(width + action_size, hidden),
                nn.ReLU(),
                nn.Linear(hidden, hidden),
                nn.ReLU(),
                nn.Linear(hidden, 1),
            )

        self.q1, self.q2 = critic(), critic()

    def forward(
        self, features: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([features, actions.flatten(1)], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def soft_q_target(
    reward: torch.Tensor,
    solved: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_logp: torch.Tensor,
    alpha: float,
    discount: float,
) -> torch.Tensor:
    """``r + discount * (1 - solved) * (min(Q1', Q2') - alpha * log pi(a'|s'))``."""
    soft_value = torch.minimum(next_q1, next_q2) - alpha * next_logp
    return reward + discount * (1.0 - solved.float()) * soft_value


def actor_loss(
    alpha: float,
    logp: torch.Tensor,
    q1: torch.Tensor,
    q2: torch.Tensor,
    kl_ref: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    """``mean(alpha * log pi(a~|s) - min(Q1, Q2)(s, a~)) + kl_coef * KL(pi || pi_start)``.

    Minimising it raises the critics' value of the reparameterised action, keeps entropy
    (through ``-alpha * log pi``) and stays near the start policy. ``logp``, ``q1``, ``q2``:
    ``(B,)``; ``kl_ref``: a scalar (already averaged over the batch).
    """
    return (alpha * logp - torch.minimum(q1, q2)).mean() + kl_coef * kl_ref


def temperature_loss(
    log_alpha: torch.Tensor, logp: torch.Tensor, target_entropy: float
) -> torch.Tensor:
    """``-mean(log_alpha * (log pi(a~|s) + target_entropy))``, ``logp`` detached ``(B,)``.

    Its gradient raises ``alpha`` while the policy's entropy (``-log pi``) is below
    ``target_entropy`` and lowers it above.
    """
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


class ReplayBuffer:
    """A ring buffer of transitions (observations stored as uint8 images and token ids)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.data: dict[str, np.ndarray] = {}
        self.size = 0
        self.cursor = 0

    def __len__(self) -> int:
        return self.size

    def add(self, rollout: Rollout) -> int:
        """Store the round's transitions (except step-limit cuts); returns how many."""
        t, n = np.nonzero(~rollout.truncated)
        fields = {
            "reward": rollout.reward[t, n],
            "solved": rollout.terminated[t, n],
            "actions": rollout.actions[t, n],
        }
        for when, tt in (("obs", t), ("next", t + 1)):
            fields[f"{when}/state"] = rollout.state[tt, n]
            fields[f"{when}/tokens"] = rollout.tokens[tt, n]
            fields[f"{when}/token_mask"] = rollout.token_mask[tt, n]
            for camera, images in rollout.images.items():
                fields[f"{when}/image/{camera}"] = images[tt, n]
            if rollout.prefix is not None and rollout.prefix_mask is not None:  # delays played
                fields[f"{when}/prefix"] = rollout.prefix[tt, n]
                fields[f"{when}/prefix_mask"] = rollout.prefix_mask[tt, n]
        count = len(t)
        if not self.data:
            self.data = {
                k: np.zeros((self.capacity, *v.shape[1:]), v.dtype) for k, v in fields.items()
            }
        slots = (self.cursor + np.arange(count)) % self.capacity
        for key, values in fields.items():
            self.data[key][slots] = values
        self.cursor = int((self.cursor + count) % self.capacity)
        self.size = min(self.capacity, self.size + count)
        return count

    def sample(self, batch: int, rng: np.random.Generator) -> dict[str, Any]:
        """A uniform batch: tensors, with ``obs``/``next`` as :meth:`VLAPolicy.forward` kwargs."""
        idx = rng.integers(0, self.size, batch)

        def observation(when: str) -> dict[str, Any]:
            images = f"{when}/image/"
            kwargs = {
                "images": {
                    k[len(images) :]: torch.as_tensor(v[idx])
                    for k, v in self.data.items()
                    if k.startswith(images)
                },
                "state": torch.as_tensor(self.data[f"{when}/state"][idx]),
                "tokens": torch.as_tensor(self.data[f"{when}/tokens"][idx]),
                "token_mask": torch.as_tensor(self.data[f"{when}/token_mask"][idx]),
            }
            for name in ("prefix", "prefix_mask"):  # a delay-conditioned policy's rollouts
                if f"{when}/{name}" in self.data:
                    kwargs[name] = torch.as_tensor(self.data[f"{when}/{name}"][idx])
            return kwargs

        return {
            "obs": observation("obs"),
            "next": observation("next"),
            "actions": torch.as_tensor(self.data["actions"][idx]),
            "reward": torch.as_tensor(self.data["reward"][idx]),
            "solved": torch.as_tensor(self.data["solved"][idx]),
        }


class SAC(RLAlgorithm):
    """The SAC learner state: critics, target critics, temperature, replay buffer, optimizers."""

    on_policy = False
    loss_metrics = ("critic_loss", "actor_loss", "kl_ref")

    def __init__(
        self,
        policy: VLAPolicy,
        reference: VLAPolicy,
        params: dict[str, nn.Parameter],
        cfg: SACConfig,
        gamma: float,
        horizon: int,
        seed: int,
    ) -> None:
        self.policy, self.reference, self.params, self.cfg = policy, reference, params, cfg
        self.discount, self.horizon = gamma**horizon, horizon
        action_size = horizon * policy.cfg.action_dim
        self.critics = TwinQ(policy.action_head.in_features, action_size)
        self.target = copy.deepcopy(self.critics).requires_grad_(False)
        self.log_alpha = nn.Parameter(torch.tensor(math.log(cfg.init_alpha)))
        self.target_entropy = (
            cfg.target_entropy if cfg.target_entropy is not None else -float(action_size)
        )
        self.actor_opt = torch.optim.Adam(list(params.values()), lr=cfg.lr)
        self.critic_opt = torch.optim.Adam(self.critics.parameters(), lr=cfg.critic_lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=cfg.lr)
        self.buffer = ReplayBuffer(cfg.buffer_size)
        self.rng = np.random.default_rng(seed)
        self.updates = 0

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_opt, "critic": self.critic_opt, "alpha": self.alpha_opt}

    def modules(self) -> dict[str, nn.Module]:
        """What a learner checkpoint saves besides the policy (the buffer is not saved)."""
        return {"critics": self.critics, "target": self.target}

    def acting_modules(self) -> dict[str, nn.Module]:
        return {}

    def update(self, batch: Rollout) -> dict[str, float]:
        added = self.buffer.add(batch)
        metrics: dict[str, float] = {"buffer": float(len(self.buffer)), "stored": float(added)}
        if len(self.buffer) < max(self.cfg.learning_starts, self.cfg.batch_size):
            return metrics | {"updates": 0.0}
        sums: dict[str, float] = {}
        for _ in range(self.cfg.updates_per_round):
            for key, value in self._update_once().items():
                sums[key] = sums.get(key, 0.0) + value
        n = self.cfg.updates_per_round
        return metrics | {k: v / n for k, v in sums.items()} | {"updates": float(n)}

    def _update_once(self) -> dict[str, float]:
        b = self.buffer.sample(self.cfg.batch_size, self.rng)
        alpha = self.log_alpha.exp().item()
        with torch.no_grad():
            next_out = self.policy(**b["next"])
            next_dist = chunk_distribution(next_out, self.horizon, b["next"].get("prefix_mask"))
            next_actions = next_dist.sample()
            next_logp = next_dist.log_prob(next_actions).sum(dim=(1, 2))
            q1_next, q2_next = self.target(pooled_features(next_out), next_actions)
            y = soft_q_target(
                b["reward"], b["solved"], q1_next, q2_next, next_logp, alpha, self.discount
            )
        train_actor = self.updates >= self.cfg.critic_warmup
        with torch.set_grad_enabled(train_actor):
            out = self.policy(**b["obs"])
        features = pooled_features(out)
        q1, q2 = self.critics(features, b["actions"])
        critic_loss = ((q1 - y) ** 2).mean() + ((q2 - y) ** 2).mean()
        self.critic_opt.zero_grad(set_to_none=True)
        critic_loss.backward()
        nn.utils.clip_grad_norm_(list(self.critics.parameters()), 10.0)
        self.critic_opt.step()
        metrics = {"critic_loss": critic_loss.item(), "q": q1.mean().item(), "alpha": alpha}
        if train_actor:
            dist = chunk_distribution(out, self.horizon, b["obs"].get("prefix_mask"))
            actions = dist.rsample()
            logp = dist.log_prob(actions).sum(dim=(1, 2))
            q1_new, q2_new = self.critics(features, actions)
            with torch.no_grad():
                ref_mean = decision_mean(
                    self.reference(**b["obs"]), self.horizon, b["obs"].get("prefix_mask")
                )
                ref_std = self.reference.log_std.exp().expand_as(ref_mean)
            kl_ref = kl_divergence(dist, Normal(ref_mean, ref_std)).sum(dim=(1, 2)).mean()
            actor = actor_loss(alpha, logp, q1_new, q2_new, kl_ref, self.cfg.kl_coef)
            self.actor_opt.zero_grad(set_to_none=True)
            actor.backward()
            grad_norm = nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)
            self.actor_opt.step()
            self.alpha_opt.zero_grad(set_to_none=True)
            temperature_loss(self.log_alpha, logp, self.target_entropy).backward()
            self.alpha_opt.step()
            metrics |= {
                "actor_loss": actor.item(),
                "kl_ref": kl_ref.item(),
                "entropy": -logp.mean().item(),
                "grad_norm": grad_norm.item(),
            }
        with torch.no_grad():
            for target, source in zip(
                self.target.parameters(), self.critics.parameters(), strict=True
            ):
                target.lerp_(source, self.cfg.tau)
        self.updates += 1
        return metrics

    def extra_state(self) -> dict[str, Any]:
        return {"updates": self.updates, "log_alpha": self.log_alpha.item()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.updates = int(state["updates"])
        with torch.no_grad():
            self.log_alpha.fill_(float(state["log_alpha"]))
