"""A task's reward per control step, as RL's rollouts read it (``StepResult.reward``): the
terms a scene config's ``scene.reward`` sets, shared by the task families that take them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class RewardTerms:
    """Reward per control step: a sparse success bonus plus dense shaping.

    ``reward = success_bonus * solved - distance_weight * d + progress_weight * (d_before - d)``
    where ``d`` is the distance the task must close (m) after the step and ``d_before`` the
    distance before it: touch's tool centre point to the named object, a Meta-World task's
    object (reach: the hand) to its goal. The progress term is potential-based shaping (Ng et
    al., 1999): it does not change which policy is optimal, it only tells a learner sooner that
    it is getting closer. A scene config may override any weight (``scene.reward``).
    """

    success_bonus: float = 1.0
    """Paid once, on the step the episode is solved."""
    distance_weight: float = 0.1
    """Per metre of that distance, every step (dense shaping)."""
    progress_weight: float = 0.0
    """Per metre the distance shrank during the step."""

    def __call__(
        self, success: np.ndarray, distance: np.ndarray, distance_before: np.ndarray
    ) -> np.ndarray:
        """Rewards float32 ``(N,)`` from success (bool), distances after/before the step (m)."""
        reward = (
            self.success_bonus * success
            - self.distance_weight * distance
            + self.progress_weight * (distance_before - distance)
        )
        return np.asarray(reward, dtype=np.float32)
