"""GRPO for the VLA: group-relative advantages over whole episodes, a clipped ratio, no critic.

The algorithm RLinf and SimpleVLA-RL fine-tune VLAs with. A round is ``groups`` of
``group_size`` episodes; the episodes of a group start from the same reset seed (the same
scene, instruction and start pose), so they differ only by the policy's sampled actions. One
update, on every worker's groups::

    outcome    R_i = 1 if episode i was solved, else 0                 (the task's own verdict)
    advantage  A_i = (R_i - mean_g R) / (std_g R + eps)                over episode i's group g
               groups that all succeeded or all failed have no signal: dropped
    every decision t of episode i gets A_i
    for each epoch, for each minibatch of the kept decisions:
        ratio = exp(log pi(a_t|s_t) - log pi_old(a_t|s_t))
        loss  = -mean(min(ratio * A, clip(ratio, 1 - clip, 1 + clip_high) * A))
                + kl_coef * mean(KL(pi(.|s) || pi_start(.|s)))         (kl_coef 0 by default)

The mean is over decisions, as in DAPO and SimpleVLA-RL. Nothing learns a value: the group is
the baseline. Within a group the advantages sum to zero, so pushing up the successful episodes'
actions and pushing down the failed ones' is the whole update.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn
from torch.distributions import Normal, kl_divergence

from stages.finetune.algorithm import RLAlgorithm
from stages.finetune.config import GRPOConfig
from stages.finetune.ppo import clipped_objective, minibatches
from stages.finetune.rollout import chunk_distribution
from stages.finetune.rounds import GroupRollout
from stages.policy.base import VLAPolicy

EPS = 1e-6
"""Added to a group's standard deviation."""


def group_advantages(outcomes: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each episode's outcome against its group's: ``(R - mean_g) / (std_g + EPS)``.

    ``outcomes``: float ``(E,)`` per episode; ``groups``: int ``(E,)``, the group of each.
    Returns (advantages float32 ``(E,)``, kept bool ``(E,)``): an episode is kept when its
    group's outcomes differ; the advantages of the others are 0.
    """
    outcomes = outcomes.astype(np.float64)
    advantages = np.zeros(len(outcomes), np.float32)
    kept = np.zeros(len(outcomes), bool)
    for g in np.unique(groups):
        members = groups == g
        spread = outcomes[members].std()
        if spread > 0:
            advantages[members] = (outcomes[members] - outcomes[members].mean()) / (spread + EPS)
            kept[members] = True
    return advantages, kept


def group_seeds(seed: int, iteration: int, slot: int, groups: int) -> list[int]:
    """The reset seeds of the groups worker ``slot`` plays in round ``iteration``: the same for
    a worker that Ray restarted, or a resumed run."""
    rng = np.random.default_rng([seed, iteration, slot, 0x6772706F])  # "grpo"
    return [int(s) for s in rng.integers(0, 2**31 - 1, groups)]


class GRPO(RLAlgorithm):
    """The GRPO learner state: one Adam over the adapters and heads; no critic."""

    on_policy = True
    plays_groups = True
    loss_metrics = ("policy_loss", "approx_kl", "kl_ref")

    @classmethod
    def start_round(
        cls,
        worker: Any,
        settings: GRPOConfig,
        seed: int,
        iteration: int,
        slot: int,
        weights: Any,
    ) -> Any:
        """``groups_per_worker`` groups of ``group_size`` whole episodes, each group from a
        reset seed drawn for this round and worker (a :class:`GroupRollout`)."""
        return worker.play_groups.remote(
            group_seeds(seed, iteration, slot, settings.groups_per_worker),
            settings.group_size,
            weights,
            iteration,
        )

    def __init__(
        self,
        policy: VLAPolicy,
        reference: VLAPolicy,
        params: dict[str, nn.Parameter],
        cfg: GRPOConfig,
        gamma: float,
        horizon: int,
        seed: int,
    ) -> None:
        del gamma  # an episode's outcome is not discounted
        if horizon != 1:
            raise ValueError(f"GRPO re-plans every control step (horizon 1), got {horizon}")
        self.policy, self.reference, self.params, self.cfg = policy, reference, params, cfg
        self.optimizer = torch.optim.Adam(list(params.values()), lr=cfg.lr)
        self.rng = np.random.default_rng(seed)

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.optimizer}

    def modules(self) -> dict[str, nn.Module]:
        return {}

    def acting_modules(self) -> dict[str, nn.Module]:
        return {}

    def update(self, batch: GroupRollout) -> dict[str, float]:
        if self.cfg.kl_coef > 0 and batch.ref_mean is None:
            raise ValueError("kl_coef > 0 needs the start policy's means (a kl_anchor worker)")
        episode_adv, kept = group_advantages(batch.success.astype(np.float32), batch.group)
        decisions = np.flatnonzero(kept[batch.episode])
        metrics = {
            "groups": float(len(np.unique(batch.group))),
            "groups_kept": float(len(np.unique(batch.group[kept]))),
            "decisions_kept": float(len(decisions)),
        }
        if len(decisions) == 0:  # every group all-success or all-failure: nothing to learn
            return metrics | {"updates": 0.0}
        adv = torch.as_tensor(episode_adv[batch.episode])
        actions = torch.as_tensor(batch.actions)
        old_logp = torch.as_tensor(batch.logp)
        ref_mean = torch.as_tensor(batch.ref_mean) if batch.ref_mean is not None else None
        sums: dict[str, float] = {}
        count = 0
        for mb in minibatches(decisions, self.cfg.minibatch_size, self.cfg.epochs, self.rng):
            index = torch.as_tensor(mb)
            obs = batch.observations(mb)
            dist = chunk_distribution(self.policy(**obs), 1, obs.get("prefix_mask"))
            logp = dist.log_prob(actions[index]).sum(dim=(1, 2))
            policy_loss, clip_frac = clipped_objective(
                logp, old_logp[index], adv[index], self.cfg.clip, self.cfg.clip_high
            )
            kl_ref = torch.zeros(())
            if ref_mean is not None and self.cfg.kl_coef > 0:
                anchor = Normal(
                    ref_mean[index],
                    self.reference.log_std.detach().exp().expand_as(ref_mean[index]),
                )
                kl_ref = kl_divergence(dist, anchor).sum(dim=(1, 2)).mean()
            loss = policy_loss + self.cfg.kl_coef * kl_ref
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            grad_norm = nn.utils.clip_grad_norm_(list(self.params.values()), 1.0)
            self.optimizer.step()
            with torch.no_grad():
                log_ratio = old_logp[index] - logp
                approx_kl = (log_ratio.exp() - 1 - log_ratio).mean()
            for key, value in (
                ("policy_loss", policy_loss.item()),
                ("kl_ref", kl_ref.item()),
                ("approx_kl", approx_kl.item()),
                ("clip_frac", clip_frac.item()),
                ("grad_norm", grad_norm.item()),
                ("entropy", dist.entropy().sum(dim=(1, 2)).mean().item()),
            ):
                sums[key] = sums.get(key, 0.0) + value
            count += 1
        return metrics | {k: v / count for k, v in sums.items()} | {"updates": float(count)}
