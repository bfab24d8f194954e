"""Group filter for GRPO/RLOO: a group whose rollouts all scored the same carries no
learning signal (zero group-relative advantage), so it is dropped and replaced by a
fresh one; see ``trainer.runner.collection`` for the bounded resampling loop.

The scores are what the group-relative advantage compares (`trajectory_scores`: the
policy's own success). The plan reward is not among them: a group plans with one
horizon and GRPO/RLOO add the reward after the normalisation, so it never makes an
all-success group's rollouts differ from one another."""

from __future__ import annotations

import torch


def informative_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """``[num_groups]`` bool: True for groups whose scores are not all equal."""
    if scores.shape[0] % group_size:
        raise ValueError(f"{scores.shape[0]} rollouts do not split into groups of {group_size}")
    groups = scores.view(-1, group_size)
    return groups.amax(1) > groups.amin(1)
