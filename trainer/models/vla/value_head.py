"""PPO's critic for a VLA: a value head on the policy's backbone.

The critic reads one more learned query token after the prompt (images, instruction,
proprio) through the same decoder the policy plans with, and maps its hidden state to
``V(obs)`` — the value head on the backbone's features of RLinf's OpenVLA-OFT PPO. The
backbone is the policy's, not a second copy: its trained weights (LoRA adapters, or the
whole model) learn from both losses and are saved once, with the policy. The critic's
own parameters are the query and the head, which is all its ``state_dict`` holds.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.encoders import mlp
from trainer.models.vla.policy import VLAChunkPolicy


class VLAValueHead(nn.Module):
    def __init__(self, policy: VLAChunkPolicy, hidden_sizes: tuple[int, ...] = ()) -> None:
        super().__init__()
        # Held outside the module tree: the policy's parameters are the policy's (its
        # optimizer group, checkpoint entry and device move), not the critic's too.
        self._policy = (policy,)
        self.query = nn.Parameter(torch.randn(1, 1, policy.width) * 0.02)
        self.head = mlp(policy.width, hidden_sizes, 1)

    @property
    def policy(self) -> VLAChunkPolicy:
        return self._policy[0]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[B, *obs_shape] -> [B]``."""
        features = self.policy.read_queries(obs, self.query)[:, 0]
        return self.head(features.to(self.query.dtype)).squeeze(-1)
