"""State-value critic ``V(obs)`` for PPO and the time-out bootstrap."""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.encoders import mlp


class ValueCritic(nn.Module):
    def __init__(self, encoder: nn.Module, head_sizes: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.encoder = encoder
        self.head = mlp(encoder.feature_dim, head_sizes, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, *obs_shape] -> [B]``."""
        return self.head(self.encoder(obs)).squeeze(-1)
