"""A Gaussian policy that plans ``H`` actions at once (dynamic horizons, seed 000).

The policy outputs a plan of ``max_horizon`` actions; a sample with horizon ``H``
executes the first ``H`` of them, one chunk of ``num_action_chunks`` at a time (see
``PlanCache``). The horizon is an input, so the policy knows how long it will act
open-loop. Log-probabilities count only the env's action dims: a model may predict
more dims than the env takes, and the extra dims are never executed.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributions import Normal

from trainer.models.encoders import mlp
from trainer.models.interface import check_action_dims

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


class GaussianChunkPolicy(nn.Module):
    """``obs, H -> Normal(mean [B, max_horizon, action_dim], std [action_dim])``."""

    def __init__(
        self,
        encoder: nn.Module,
        action_dim: int,
        env_action_dim: int,
        max_horizon: int,
        head_sizes: tuple[int, ...] = (),
        init_log_std: float = 0.0,
    ) -> None:
        super().__init__()
        check_action_dims(action_dim, env_action_dim)
        self.encoder = encoder
        self.action_dim = action_dim
        self.env_action_dim = env_action_dim
        self.max_horizon = max_horizon
        feature_dim = encoder.feature_dim + 1  # + the normalised horizon
        self.head = mlp(feature_dim, head_sizes, max_horizon * action_dim)
        self.log_std = nn.Parameter(torch.full((action_dim,), float(init_log_std)))
        # Small last layer: the first plans stay close to zero motion, so exploration
        # comes from the std rather than from a random bias per task.
        last = self.head[-1]
        assert isinstance(last, nn.Linear)
        nn.init.orthogonal_(last.weight, gain=0.01)
        nn.init.zeros_(last.bias)

    def plan_mean(self, obs: torch.Tensor, horizons: torch.Tensor) -> torch.Tensor:
        """Mean of the plan ``[B, max_horizon, action_dim]``, in float32 also when the
        network ran in bf16 (autocast): sampling and log-probs are float32 math, the
        same at rollout and in the update."""
        features = self.encoder(obs)
        horizon_feature = (horizons.to(features.dtype) / self.max_horizon).unsqueeze(1)
        mean = self.head(torch.cat([features, horizon_feature], dim=1))
        return mean.float().view(-1, self.max_horizon, self.action_dim)

    def distribution(self, obs: torch.Tensor, horizons: torch.Tensor) -> Normal:
        mean = self.plan_mean(obs, horizons)
        return Normal(mean, self.log_std.exp().expand_as(mean))

    @torch.no_grad()
    def sample_plan(
        self,
        obs: torch.Tensor,
        horizons: torch.Tensor,
        deterministic: bool = False,
        steps: int | None = None,
        chunk: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A plan ``[B, steps, action_dim]`` (``steps`` defaults to the max horizon) and
        the log-prob over the env's dims of each run of ``chunk`` consecutive actions
        ``[B, steps // chunk]`` (with the default ``chunk=1``, of each action).

        ``steps`` lets a caller whose samples all have horizons of at most ``steps``
        skip drawing actions that would never run (drawing them is a large part of a
        small policy's cost). The log-prob comes straight from the standard-normal
        draw ``z`` (the action is ``mean + std * z``): the same density ``_log_prob``
        gives from the action, in a third of the ops, summed over each chunk in the
        same reduction.
        """
        mean = self.plan_mean(obs, horizons)
        if steps is not None:
            mean = mean[:, :steps]
        batch, plan_steps, _ = mean.shape
        if plan_steps % chunk:
            raise ValueError(f"a plan of {plan_steps} steps does not split into chunks of {chunk}")
        dims = self.env_action_dim
        log_std = self.log_std[:dims]
        constant = chunk * (log_std.sum() + dims * _HALF_LOG_2PI)
        if deterministic:
            return mean, (-constant).expand(batch, plan_steps // chunk).clone()
        noise = torch.randn_like(mean)
        plan = torch.addcmul(mean, noise, self.log_std.exp())
        per_chunk = noise[..., :dims].reshape(batch, plan_steps // chunk, chunk * dims)
        return plan, per_chunk.pow(2).sum(-1).mul(-0.5).sub(constant)

    def chunk_log_prob(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Log-prob and entropy of an executed chunk, recomputed for training.

        ``plan_obs`` is the observation the plan was made from and ``offsets`` where the
        chunk starts inside that plan: with both stored at rollout time, this gives
        exactly the rollout's log-probabilities for the same parameters.
        """
        log_probs, entropy = self.token_log_probs(
            plan_obs, horizons, offsets, chunk_actions, plan_latent
        )
        return log_probs.sum((1, 2)), entropy.sum((1, 2))

    def token_log_probs(
        self,
        plan_obs: torch.Tensor,
        horizons: torch.Tensor,
        offsets: torch.Tensor,
        chunk_actions: torch.Tensor,
        plan_latent: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``chunk_log_prob`` per token ``[B, chunk, env dims]``: each action dim of each
        step is a token (the unit a per-token ratio clips), with its entropy."""
        del plan_latent  # a plan of this policy says all its log-prob needs
        chunk = chunk_actions.shape[1]
        dims = self.env_action_dim
        mean = self.plan_mean(plan_obs, horizons)
        if chunk < self.max_horizon:  # else every chunk is a whole plan, at offset 0
            steps = offsets.long().unsqueeze(1) + torch.arange(chunk, device=offsets.device)
            mean = mean.gather(1, steps[:, :, None].expand(-1, -1, self.action_dim))
        mean = mean[..., :dims]
        log_std = self.log_std[:dims]
        log_probs = _log_prob(chunk_actions[..., :dims], mean, log_std)
        entropy = (0.5 + _HALF_LOG_2PI + log_std).expand_as(log_probs)
        return log_probs, entropy

    def step_log_probs(
        self, obs: torch.Tensor, horizons: torch.Tensor, plans: torch.Tensor
    ) -> torch.Tensor:
        """``[B, max_horizon]``: the log-prob of each step of whole plans ``plans [B,
        max_horizon, action_dim]`` over the env's dims (behaviour cloning's targets)."""
        dims = self.env_action_dim
        mean = self.plan_mean(obs, horizons)[..., :dims]
        return _log_prob(plans[..., :dims], mean, self.log_std[:dims]).sum(-1)


def _log_prob(actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Per-dim Gaussian log-density. Written out rather than through torch's ``Normal``
    (argument validation, a broadcast std per row): it sits in the rollout's and the
    update's hot loops, and sampling and training share this one formula, so the
    recomputed log-probs match the rollout's exactly."""
    z = (actions - mean) * torch.exp(-log_std)
    return -0.5 * z.pow(2) - log_std - _HALF_LOG_2PI
