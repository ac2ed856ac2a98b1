"""RL algorithms: the interface the learner and the run use, and the registry that names them.

An algorithm is a class (PPO in :mod:`stages.finetune.ppo`, SAC in :mod:`stages.finetune.sac`,
GRPO in :mod:`stages.finetune.grpo`) that declares what sets it apart as class attributes
(:attr:`RLAlgorithm.on_policy`, :attr:`~RLAlgorithm.plays_groups`,
:attr:`~RLAlgorithm.value_head`, the metrics its curves plot) and says how a rollout worker
plays one of its rounds (:meth:`RLAlgorithm.start_round`). The run (:mod:`stages.finetune.rl`)
and the learner read only these: no code outside :data:`ALGORITHMS` compares an algorithm's
name.

It is built as ``cls(policy, reference, params, settings, gamma, horizon, seed)``: the policy
being trained, the frozen start policy (the KL anchor), the parameters RL trains
(:func:`stages.finetune.rollout.rl_parameters`), its config section (``finetune.rl.<name>``,
e.g. :class:`~stages.finetune.config.PPOConfig`), the discount per control step, the actions
executed per decision, and the seed of its sampling RNG. It owns its own heads (value head,
critics) and optimizers; the learner checkpoints them through :meth:`RLAlgorithm.modules` and
:meth:`RLAlgorithm.optimizers`, and sends the rollout workers the ones they act with
(:meth:`RLAlgorithm.acting_modules`).

Adding an algorithm: its module (the class), its config section (a settings class in
:mod:`stages.finetune.config` and the :class:`~stages.finetune.config.RLConfig` field named like
the algorithm), and one line in :data:`ALGORITHMS`.
"""

from __future__ import annotations

import abc
import pkgutil
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np
    import torch
    from torch import nn

    from stages.finetune.rounds import GroupRollout, Rollout  # noqa: F401 (docs)
    from stages.policy.base import VLAPolicy

ALGORITHMS: dict[str, str] = {
    "ppo": "stages.finetune.ppo:PPO",
    "sac": "stages.finetune.sac:SAC",
    "grpo": "stages.finetune.grpo:GRPO",
}
"""``finetune.algo`` values that run RL in simulation -> ``module:class`` of the algorithm,
imported when an RL run starts (the classes load torch and the policy; the config checks names
without them)."""


def algorithm_class(name: str) -> type[RLAlgorithm]:
    """The class of RL algorithm ``name``; unknown names list the valid choices."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown RL algorithm {name!r}; valid choices: {', '.join(ALGORITHMS)}")
    algorithm: type[RLAlgorithm] = pkgutil.resolve_name(ALGORITHMS[name])
    return algorithm


class RLAlgorithm(abc.ABC):
    """One RL algorithm's learner-side state: what it trains besides the policy, and how."""

    on_policy: ClassVar[bool]
    """True: each update trains on the round the workers just played with the newest weights,
    so rollouts and updates alternate (PPO, GRPO). False: it learns from a replay buffer, so
    the next round plays while the learner trains on this one and the new weights reach each
    worker behind the rollout it is playing (SAC)."""
    plays_groups: ClassVar[bool] = False
    """A round is groups of whole episodes, each group from one reset seed
    (:meth:`RolloutWorker.play_groups` -> :class:`GroupRollout`, GRPO), rather than ``T``
    decisions of environments that run on across rounds (:class:`Rollout`)."""
    value_head: ClassVar[bool] = False
    """Its critic is a state-value head the rollout workers run, synced, to record each
    state's value as they play (PPO). SAC's critics read the action too and stay in the
    learner; GRPO has none (the group is the baseline)."""
    loss_metrics: ClassVar[tuple[str, ...]]
    """Metrics of its updates that the learning curves plot."""

    rng: np.random.Generator
    """Draws minibatches / replay samples; saved with each checkpoint (a resume continues it)."""

    @abc.abstractmethod
    def __init__(
        self,
        policy: VLAPolicy,
        reference: VLAPolicy,
        params: dict[str, nn.Parameter],
        settings: Any,
        gamma: float,
        horizon: int,
        seed: int,
    ) -> None:
        """Build the algorithm's state for ``policy`` (see the module docstring); ``settings``
        is its config section."""

    @classmethod
    def worker_kinds(cls, settings: Any) -> dict[str, bool]:
        """What its rollout workers run besides the policy (the keyword arguments of
        :class:`~stages.finetune.rollout.RolloutWorker`): ``kl_anchor``, the frozen start
        policy, whose means they record when ``settings.kl_coef > 0`` and the algorithm is
        on-policy (its update trains on exactly those decisions; a replay update computes the
        anchor on the transitions it samples); ``value_head``; ``episodic`` (groups)."""
        return {
            "kl_anchor": cls.on_policy and settings.kl_coef > 0,
            "value_head": cls.value_head,
            "episodic": cls.plays_groups,
        }

    @classmethod
    def start_round(
        cls, worker: Any, settings: Any, seed: int, iteration: int, slot: int, weights: Any
    ) -> Any:
        """Start rollout worker ``worker``'s (in ``slot``) share of round ``iteration``: the
        Ray call, with the synced ``weights`` of that iteration. By default
        ``settings.steps_per_env`` decisions of its running environments (a :class:`Rollout`);
        ``seed`` is the run's root seed, for algorithms that pick reset seeds per round."""
        return worker.rollout.remote(settings.steps_per_env, weights, iteration)

    @abc.abstractmethod
    def update(self, batch: Any) -> dict[str, float]:
        """Train on one round. PPO and SAC: a :class:`Rollout`, every worker's side by side,
        ``T`` decisions x ``N`` environments (observations ``(T + 1, N, ...)``, actions
        ``(T, N, horizon, action_dim)`` in normalised units, rewards ``(T, N)`` discounted
        within each executed chunk). GRPO: a :class:`GroupRollout`, whole episodes in groups
        that share a reset seed. Returns the update's metrics (losses, ``updates``: gradient
        steps taken), averaged over its gradient steps."""

    @abc.abstractmethod
    def modules(self) -> dict[str, nn.Module]:
        """What a learner checkpoint saves besides the policy (value head, critics), by name."""

    @abc.abstractmethod
    def acting_modules(self) -> dict[str, nn.Module]:
        """Modules the rollout workers run beside the policy, by name, synced with it (PPO:
        the value head, so the workers record each state's value as they play)."""

    @abc.abstractmethod
    def optimizers(self) -> dict[str, torch.optim.Optimizer]:
        """The optimizers whose state a learner checkpoint saves, by name."""

    def extra_state(self) -> dict[str, Any]:
        """Counters and scalars to save as JSON (e.g. SAC's update count and temperature);
        none by default."""
        return {}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`extra_state` returned; nothing by default."""
        del state
