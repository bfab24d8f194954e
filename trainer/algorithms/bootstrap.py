"""Time-out bootstrap from the true terminal observation (seed 002).

A time-out cuts an episode that could have gone on, so the last reward should carry
the value of where the agent was: ``r += γ·V(s_terminal)``. The vectorised env has
already auto-reset such copies, so ``obs`` is the NEXT episode's first observation and
using it would bootstrap from the wrong state; rsl_rl, instinct_rl and HIMLoco use
``V(s_t)`` (the state before the last action) instead. We use the true final
observation the env reports, for all timed-out copies in one batched critic call, and
fold the result into the reward at once, so the rollout storage needs no extra field.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Critic = Callable[[torch.Tensor], torch.Tensor]


def bootstrap_timeouts(
    rewards: torch.Tensor,
    timeouts: torch.Tensor,
    final_observation: torch.Tensor | None,
    next_obs: torch.Tensor,
    critic: Critic,
    gamma: float,
    to_device: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``rewards + γ·V(s_terminal)`` where ``timeouts``; ``s_terminal`` is the env's
    final observation when it gives one, else ``next_obs``. ``rewards`` is never
    modified: without time-outs it is returned as is, else a changed copy.

    The flags and observations are the env's, on the CPU, where looking at them costs
    nothing; `rewards` and the critic's values may be on a GPU, where `to_device` takes
    the timed-out rows and their indices (default: a plain copy to the rewards'
    device), so that nothing is read back from it."""
    if not bool(timeouts.any()):
        return rewards
    move = to_device or (lambda tensor: tensor.to(rewards.device))
    index = timeouts.nonzero().squeeze(1)
    source = final_observation if final_observation is not None else next_obs
    with torch.no_grad():
        values = critic(move(source.index_select(0, index)))
    return rewards.index_add(0, move(index), values.to(rewards.dtype), alpha=gamma)
