"""PPO's critic for a VLA: a value head on the policy's backbone.

The critic reads one more learned query token after the prompt (images, instruction,
proprio) through the same decoder the policy plans with, and maps its hidden state to
``V(obs)`` — the value head on the backbone's features of RLinf's OpenVLA-OFT PPO. The
backbone is the policy's, not a second copy: its trained weights (LoRA adapters, or the
whole model) learn from both losses and are saved once, with the policy. The critic's
own parameters are the query, the head and the plan's embeddings, which is all its
``state_dict`` holds.

A π0's critic (`Pi0ValueHead`) reads the prefix's features instead (its last hidden
states over the images and the instruction, averaged), with the same plan embeddings
added: the action expert only ever sees the noisy chunk, which says nothing of a value.
Its value loss trains the backbone too, or (`critic.train_backbone: false`) reads the
features under a stop-gradient, as RLinf's π0 PPO does (`detach_critic_input`): then only
the policy loss moves what the policy plans with.

The query carries where the state stands in its plan: embeddings of the plan's horizon
and of the offset into it are added to it, as the policy's plan queries carry the
horizon (see trainer.models.critic for why a value needs them). A value head saved
before them loads with them at zero: the query it had.
"""

from __future__ import annotations

import torch
from torch import nn

from trainer.models.critic import fill_missing_plan_inputs
from trainer.models.encoders import mlp
from trainer.models.vla.pi0_policy import Pi0ChunkPolicy
from trainer.models.vla.policy import VLAChunkPolicy


class VLAValueHead(nn.Module):
    # The plan inputs' parameters, registered last (see optimizer_state_with_plan_inputs).
    plan_parameters = ("horizon_embedding.weight", "offset_embedding.weight")

    def __init__(self, policy: VLAChunkPolicy, hidden_sizes: tuple[int, ...] = ()) -> None:
        super().__init__()
        # Held outside the module tree: the policy's parameters are the policy's (its
        # optimizer group, checkpoint entry and device move), not the critic's too.
        self._policy = (policy,)
        self.query = nn.Parameter(torch.randn(1, 1, policy.width) * 0.02)
        self.head = mlp(policy.width, hidden_sizes, 1)
        self.horizon_embedding = nn.Embedding(policy.max_horizon + 1, policy.width)
        self.offset_embedding = nn.Embedding(policy.max_horizon, policy.width)
        for embedding in (self.horizon_embedding, self.offset_embedding):
            nn.init.normal_(embedding.weight, std=0.02)  # the scale of the query's own
        fill_missing_plan_inputs(self, self.plan_parameters)

    @property
    def policy(self) -> VLAChunkPolicy:
        return self._policy[0]

    def forward(
        self, obs: torch.Tensor, horizons: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        """``[B, *obs_shape], [B], [B] -> [B]``: the value of each observation at its
        place in a plan of horizon ``horizons`` (``offsets`` actions into it)."""
        plan = self.horizon_embedding(horizons.long()) + self.offset_embedding(offsets.long())
        features = self.policy.read_queries(obs, self.query + plan.unsqueeze(1))[:, 0]
        return self.head(features.to(self.query.dtype)).squeeze(-1)


class Pi0ValueHead(nn.Module):
    """PPO's critic for a π0: a head on the prefix's features and the plan's place."""

    plan_parameters = ("horizon_embedding.weight", "offset_embedding.weight")

    def __init__(
        self,
        policy: Pi0ChunkPolicy,
        hidden_sizes: tuple[int, ...] = (),
        train_backbone: bool = True,
    ) -> None:
        super().__init__()
        self._policy = (policy,)  # held outside the module tree, as VLAValueHead's
        policy.shares_prefix = True  # the update's log-prob pass keeps the features
        self.train_backbone = train_backbone
        self.head = mlp(policy.width, hidden_sizes, 1)
        self.horizon_embedding = nn.Embedding(policy.max_horizon + 1, policy.width)
        self.offset_embedding = nn.Embedding(policy.max_horizon, policy.width)
        for embedding in (self.horizon_embedding, self.offset_embedding):
            nn.init.normal_(embedding.weight, std=0.02)

    @property
    def policy(self) -> Pi0ChunkPolicy:
        return self._policy[0]

    def forward(
        self, obs: torch.Tensor, horizons: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        plan = self.horizon_embedding(horizons.long()) + self.offset_embedding(offsets.long())
        detached = not self.train_backbone
        features = self.policy.prefix_features(obs, detached).to(plan.dtype) + plan
        return self.head(features).squeeze(-1)
