"""What a rollout worker played in one round, as the learner trains on it.

:class:`Rollout` (PPO, SAC: ``T`` decisions of ``N`` environments that keep running across
rounds) and :class:`GroupRollout` (GRPO: whole episodes in groups that share a reset seed) share
:class:`PlayedRound` (observations, actions, log-probabilities, bookkeeping). The workers that
play them are :mod:`stages.finetune.rollout`'s; the learner joins the workers' rounds with
:func:`concat_rollouts` / :func:`concat_groups`.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np
import torch


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
    prefix: np.ndarray | None = None
    """float32 ``(*B, chunk_len, action_dim)``, robot units: the actions committed when each
    observation was made, a delay-conditioned policy's input (:mod:`stages.finetune.committed`;
    ``actions`` are the chunk's positions after them); None: a policy without (no delay)."""
    prefix_mask: np.ndarray | None = None
    """float32 ``(*B, chunk_len)``: 1 where ``prefix`` holds a committed action."""
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
        numpy index over the leading axes), as tensors; with the committed prefix, when
        recorded."""
        kwargs = {
            "images": {c: torch.as_tensor(v[index]) for c, v in self.images.items()},
            "state": torch.as_tensor(self.state[index]),
            "tokens": torch.as_tensor(self.tokens[index]),
            "token_mask": torch.as_tensor(self.token_mask[index]),
        }
        if self.prefix is not None and self.prefix_mask is not None:
            kwargs["prefix"] = torch.as_tensor(self.prefix[index])
            kwargs["prefix_mask"] = torch.as_tensor(self.prefix_mask[index])
        return kwargs


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
        prefix=_joined([r.prefix for r in rollouts], axis=0),
        prefix_mask=_joined([r.prefix_mask for r in rollouts], axis=0),
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
        prefix=_joined([r.prefix for r in rollouts], axis=1),
        prefix_mask=_joined([r.prefix_mask for r in rollouts], axis=1),
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

    def flat_or_none(a: np.ndarray | None) -> np.ndarray | None:
        return None if a is None else flat(a)

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
        prefix=flat_or_none(rollout.prefix),
        prefix_mask=flat_or_none(rollout.prefix_mask),
    )
