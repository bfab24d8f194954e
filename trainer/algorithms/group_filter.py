"""Group filter for GRPO/RLOO: a group whose rollouts all scored the same carries no
learning signal (zero group-relative advantage), so it is dropped and replaced by a
fresh one; see ``trainer.runner.collection`` for the bounded resampling loop.

Scores, not successes: with the plan reward, an all-success group whose horizons
differ still has something to learn from, and is kept."""

from __future__ import annotations

import torch


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[num_groups]`` bool: True for groups whose scores are not all equal."""
    if scores.shape[0] % group_size:
        raise ValueError(f"{scores.shape[0]} rollouts do not split into groups of {group_size}")
    groups = scores.view(-1, group_size)
    return groups.amax(1) > groups.amin(1)
