"""Advantage estimators: GAE for PPO, group-relative outcome advantages for GRPO/RLOO."""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    gae_lambda: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over ``[T, B]`` tensors.

    ``dones[t]`` means the episode ended with step ``t``: nothing after it is
    discounted back. A time-out is also a ``done``; its continuation value has already
    been added to ``rewards[t]`` by the time-out bootstrap. ``last_values`` is
    ``V(s_T)`` for episodes still running after the last row.
    """
    steps = rewards.shape[0]
    advantages = torch.zeros_like(rewards)
    running = torch.zeros_like(last_values)
    for t in reversed(range(steps)):
        next_values = last_values if t == steps - 1 else values[t + 1]
        not_done = 1.0 - dones[t].float()
        delta = rewards[t] + gamma * next_values * not_done - values[t]
        running = delta + gamma * gae_lambda * not_done * running
        advantages[t] = running
    return advantages, advantages + values


def _groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    if scores.dim() != 1 or scores.shape[0] % group_size:
        raise ValueError(f"{scores.shape[0]} scores do not split into groups of {group_size}")
    return scores.view(-1, group_size)


def group_normalized_advantages(
    scores: torch.Tensor, group_size: int, eps: float = 1e-6
) -> torch.Tensor:
    """GRPO: ``(score - group mean) / (group std + eps)``, the std with Bessel's correction
    (``torch.std``), as in DeepSeekMath and TRL. Consecutive ``group_size`` scores form a
    group; a group with identical scores gets exactly zero advantages (in float32 the
    mean of six 1.2s is not 1.2, and that rounding noise divided by its own tiny std
    would come out as ±0.1)."""
    groups = _groups(scores.double(), group_size)
    mean = groups.mean(1, keepdim=True)
    std = groups.std(1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)
    advantages = (groups - mean) / (std + eps)
    equal = groups.amax(1, keepdim=True) == groups.amin(1, keepdim=True)
    return advantages.masked_fill(equal, 0.0).reshape(-1).to(scores.dtype)


def leave_one_out_advantages(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """RLOO: each score minus the mean of the other ``group_size - 1`` scores of its group."""
    if group_size < 2:
        raise ValueError("RLOO needs group_size >= 2 (a leave-one-out baseline)")
    groups = _groups(scores.float(), group_size)
    others = (groups.sum(1, keepdim=True) - groups) / (group_size - 1)
    return (groups - others).reshape(-1)
