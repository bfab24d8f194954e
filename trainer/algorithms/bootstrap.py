"""Time-out bootstrap from the true terminal observation (seed 002).

A time-out cuts an episode that could have gone on, so the last reward should carry
the value of where the agent was: ``r += γ·V(s_terminal)``. The vectorised env has
already auto-reset such copies, so ``obs`` is the NEXT episode's first observation and
using it would bootstrap from the wrong state; rsl_rl, instinct_rl and HIMLoco use
``V(s_t)`` (the state before the last action) instead. We use the true final
observation the env reports, for all timed-out copies in one batched critic call, and
fold the result into the reward at once, so the rollout storage needs no extra field.

The critic values a state at its place in the plan (trainer.models.critic): the
terminal state is one chunk further into the plan than the step that reached it, at
``(offset + chunk) mod H`` (0 when that chunk used the plan up: a fresh plan).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

# V(obs, horizons, offsets)
Critic = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def bootstrap_timeouts(
    rewards: torch.Tensor,
    timeouts: torch.Tensor,
    final_observation: torch.Tensor | None,
    next_obs: torch.Tensor,
    critic: Critic,
    gamma: float,
    to_device: Callable[[torch.Tensor], torch.Tensor] | None = None,
    *,
    horizons: torch.Tensor,
    offsets: torch.Tensor,
    chunk: int,
) -> torch.Tensor:
    """``rewards + γ·V(s_terminal)`` where ``timeouts``; ``s_terminal`` is the env's
    final observation when it gives one, else ``next_obs``. ``rewards`` is never
    modified: without time-outs it is returned as is, else a changed copy.

    ``horizons`` and ``offsets`` (on the rewards' device) are the plan and the offset of
    the chunk each copy has just executed, ``chunk`` actions long; the terminal state
    is valued where the plan stands after it.

    The flags and observations are the env's, on the CPU, where looking at them costs
    nothing; `rewards` and the critic's values may be on a GPU, where `to_device` takes
    the timed-out rows and their indices (default: a plain copy to the rewards'
    device), so that nothing is read back from it."""
    if not bool(timeouts.any()):
        return rewards
    move = to_device or (lambda tensor: tensor.to(rewards.device))
    index = timeouts.nonzero().squeeze(1)
    rows = move(index)
    source = final_observation if final_observation is not None else next_obs
    horizon = horizons.index_select(0, rows)
    offset = (offsets.index_select(0, rows) + chunk) % horizon
    with torch.no_grad():
        values = critic(move(source.index_select(0, index)), horizon, offset)
    return rewards.index_add(0, rows, values.to(rewards.dtype), alpha=gamma)
