"""Demonstrations as plan targets for behaviour cloning: from each demo row, the actions
the demonstrator took in that row and the rows that followed it in its episode, up to a
plan's length.

A demo file is a set of transitions in no promised order (recorded step by step across
copies, or one episode after another). A row's successor is the row whose observation is
its next observation, found by the observations' bytes; a terminal row has none. Two
rows with the same observation lead to the same successor, which is what a plan from
that state should be.
"""

from __future__ import annotations

import torch

from trainer.data.demo_episodes import row_key
from trainer.data.replay import Batch


def successors(demos: Batch) -> torch.Tensor:
    """``[N]``: the index of each row's successor in its episode, -1 where it has none."""
    obs, next_obs = demos["obs"], demos["next_obs"]
    first_row_of = {}
    for index in range(obs.shape[0] - 1, -1, -1):  # the first row wins a tie
        first_row_of[row_key(obs[index])] = index
    following = [
        -1 if bool(demos["terminal"][index]) else first_row_of.get(row_key(row), -1)
        for index, row in enumerate(next_obs)
    ]
    return torch.tensor(following, dtype=torch.long)


def plan_targets(demos: Batch, max_horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``actions [N, max_horizon, action_dim]`` from each row on, and ``valid [N,
    max_horizon]``: which of them the episode still had (the rest repeat its last)."""
    rows = demos["obs"].shape[0]
    following = successors(demos)
    index = torch.empty(rows, max_horizon, dtype=torch.long)
    valid = torch.zeros(rows, max_horizon, dtype=torch.bool)
    index[:, 0], valid[:, 0] = torch.arange(rows), True
    for step in range(1, max_horizon):
        after = following[index[:, step - 1]]
        valid[:, step] = valid[:, step - 1] & (after >= 0)
        index[:, step] = torch.where(valid[:, step], after, index[:, step - 1])
    return demos["action"][index], valid
