"""Small heads RL trains on the policy's features (``pooled_features``, ``(B, d)``)."""

from __future__ import annotations

import torch
from torch import nn


class ValueHead(nn.Module):
    """Features ``(B, d)`` -> state value ``(B,)`` (PPO's critic). The learner trains it; the
    rollout workers run a synced copy to value the states they visit."""

    def __init__(self, width: int, hidden: int = 128) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(width, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh()
        )
        self.out = nn.Linear(hidden, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.out(self.net(features)).squeeze(-1)
