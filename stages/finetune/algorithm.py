"""The interface of an RL algorithm, as the learner (:mod:`stages.finetune.learner`) uses it.

PPO (:mod:`stages.finetune.ppo`), SAC (:mod:`stages.finetune.sac`) and GRPO
(:mod:`stages.finetune.grpo`) implement it. An
algorithm is built as ``Algorithm(policy, reference, params, settings, gamma, horizon, seed)``:
the policy being trained, the frozen start policy (the KL anchor), the parameters RL trains
(:func:`stages.finetune.rollout.rl_parameters`), its config section (``PPOConfig`` /
``SACConfig``), the discount per control step, the actions executed per decision, and the seed
of its sampling RNG. It owns its own heads (value head, critics) and optimizers; the learner
checkpoints them through :meth:`RLAlgorithm.modules` and :meth:`RLAlgorithm.optimizers`, and
sends the rollout workers the ones they act with (:meth:`RLAlgorithm.acting_modules`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from stages.finetune.rollout import GroupRollout, Rollout  # noqa: F401 (docs)


class RLAlgorithm(Protocol):
    """One RL algorithm's learner-side state: what it trains besides the policy, and how."""

    rng: np.random.Generator
    """Draws minibatches / replay samples; saved with each checkpoint (a resume continues it)."""

    def update(self, batch: Any) -> dict[str, float]:
        """Train on one round. PPO and SAC: a :class:`Rollout`, every worker's side by side,
        ``T`` decisions x ``N`` environments (observations ``(T + 1, N, ...)``, actions
        ``(T, N, horizon, action_dim)`` in normalised units, rewards ``(T, N)`` discounted
        within each executed chunk). GRPO: a :class:`GroupRollout`, whole episodes in groups
        that share a reset seed. Returns the update's metrics (losses, ``updates``: gradient
        steps taken), averaged over its gradient steps."""
        ...

    def modules(self) -> dict[str, nn.Module]:
        """What a learner checkpoint saves besides the policy (value head, critics), by name."""
        ...

    def acting_modules(self) -> dict[str, nn.Module]:
        """Modules the rollout workers run beside the policy, by name, synced with it (PPO:
        the value head, so the workers record each state's value as they play)."""
        ...

    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers whose state a learner checkpoint saves, by name."""
        ...

    def extra_state(self) -> dict[str, Any]:
        """Counters and scalars to save as JSON (e.g. SAC's update count and temperature)."""
        ...

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned."""
        ...
