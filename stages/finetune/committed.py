"""RL rollouts at an inference delay: the actions each environment has committed.

A delay-conditioned policy (``policy.prefix_ticks`` > 0) is trained in BC with simulated delays
(:func:`stages.finetune.data.simulated_delays`); its RL fine-tune plays them too, so that what
RL improves is the policy as the asynchronous runtime runs it. Each episode draws its delay
``d`` ticks by the same rule (:func:`~stages.finetune.data.draw_delays`: none for half of them,
else 1..``prefix_ticks``) and keeps it, as a device keeps its latency. Per environment, a
decision runs as a pipelined runtime does::

    episode start   d safe actions are committed (the robot holds while the first chunk is
                    computed: the runtime's dry queue)
    each decision   the policy sees the observation and the d committed actions (its prefix,
                    chunk positions 0..d-1); its chunk's positions d .. d+horizon-1 are sampled
                    and committed after them; the next ``horizon`` committed actions execute

so ``d`` actions stay committed at every decision, the decision's action is the ``horizon``
actions at positions ``d`` onwards (:func:`~stages.finetune.rollout.chunk_distribution`'s
``prefix_mask``), and the robot always executes actions chosen ``d`` ticks earlier. ``d = 0``
is today's rollout exactly. Robot units throughout (the prefix is what the policy takes).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from robots.spec import RobotSpec
from stages.finetune.data import draw_delays


class CommittedActions:
    """The committed actions of ``num_envs`` environments, each at its episode's delay."""

    def __init__(
        self,
        spec: RobotSpec,
        num_envs: int,
        chunk_len: int,
        horizon: int,
        max_ticks: int,
        rng: np.random.Generator,
    ) -> None:
        """``max_ticks``: the largest delay drawn (the policy's ``prefix_ticks``), at most
        ``chunk_len - horizon`` so that a decision's actions fit in its chunk."""
        self.spec, self.chunk_len, self.horizon, self.rng = spec, chunk_len, horizon, rng
        self.max_ticks = min(max_ticks, chunk_len - horizon)
        self.delay = np.zeros(num_envs, np.int64)
        """Each environment's delay this episode, ticks."""
        self.queue: list[list[np.ndarray]] = [[] for _ in range(num_envs)]
        """Per environment, its committed actions in the order they execute."""

    def restart(self, envs: Iterable[int], state: np.ndarray) -> None:
        """Environments ``envs`` start an episode whose first state is ``state[e]``
        (``(N, state_dim)``): a new delay each, that many safe actions committed."""
        envs = [int(e) for e in envs]
        if not envs:
            return
        delays = draw_delays(self.rng, len(envs), self.max_ticks)
        for e, d in zip(envs, delays, strict=True):
            self.delay[e] = d
            self.queue[e] = [self.spec.hold_action(state[e])] * int(d)

    def prefix(self) -> dict[str, np.ndarray]:
        """The policy's ``prefix`` float32 ``(N, chunk_len, action_dim)`` (robot units, zeros
        past the committed ones) and ``prefix_mask`` float32 ``(N, chunk_len)``."""
        n = len(self.queue)
        prefix = np.zeros((n, self.chunk_len, self.spec.action.dim), np.float32)
        mask = np.zeros((n, self.chunk_len), np.float32)
        for e, queued in enumerate(self.queue):
            if queued:
                prefix[e, : len(queued)] = np.stack(queued)
                mask[e, : len(queued)] = 1.0
        return {"prefix": prefix, "prefix_mask": mask}

    def commit(self, actions: np.ndarray) -> np.ndarray:
        """Commit each environment's decision ``actions`` ``(N, horizon, action_dim)`` (robot
        units) after what it has committed; returns the ``(N, horizon, action_dim)`` actions
        that execute now, the first committed."""
        executed = np.empty_like(actions)
        for e, queued in enumerate(self.queue):
            queued += list(actions[e])
            executed[e] = np.stack(queued[: self.horizon])
            del queued[: self.horizon]
        return executed
