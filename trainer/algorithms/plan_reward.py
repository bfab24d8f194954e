"""Plan reward (seed 000): successful trajectories that planned further ahead score more.

At scoring, a successful trajectory gets ``plan_reward_coef × H / base_h`` on top of its
outcome, where ``H`` is the planning horizon it ran with. Failed trajectories get
nothing, so the bonus never rewards long open-loop plans that miss.
"""

from __future__ import annotations

import torch


def plan_reward_bonus(
    success: torch.Tensor, horizon: torch.Tensor, coef: float, base_h: float
) -> torch.Tensor:
    """``[B]`` bonus: ``coef × H / base_h`` where ``success``, else 0."""
    return success.float() * coef * horizon.float() / base_h
