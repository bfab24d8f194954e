"""Group filter for GRPO/RLOO: groups whose rollouts all succeed or all fail carry no
learning signal (zero group-relative advantage), so they are dropped and replaced by
fresh ones; see ``trainer.runner.collection`` for the bounded resampling loop."""

from __future__ import annotations

import torch


def informative_groups(success: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[num_groups]`` bool: True for groups with both successes and failures."""
    if success.shape[0] % group_size:
        raise ValueError(f"{success.shape[0]} rollouts do not split into groups of {group_size}")
    groups = success.view(-1, group_size)
    return groups.any(1) & ~groups.all(1)
