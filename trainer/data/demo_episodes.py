"""The episodes of a set of demo transitions, for formats that store whole episodes.

A demo file promises no row order (`record_demos` of old wrote its copies' steps
interleaved). A row continues an open episode when its observation is the next
observation that episode waits for; it starts one otherwise. A terminal row closes its
episode; the last row of a time-out waits forever (its next observation is the true
final one, which no row starts from). Rows are matched by a digest of their bytes, so
image rows cost 16 bytes each, not their size.

Two copies in the same state at once wait for the same observation; which of them a
row joins does not matter, as their pasts are indistinguishable from there on.
"""

from __future__ import annotations

import hashlib
from collections import deque

import torch

from trainer.data.replay import Batch


def split_episodes(demos: Batch) -> list[torch.Tensor]:
    """The row indices of each episode in time order, episodes in the order of their
    first rows."""
    obs, next_obs, terminal = demos["obs"], demos["next_obs"], demos["terminal"]
    waiting: dict[bytes, deque[int]] = {}  # an observation -> the episodes waiting for it
    members: list[list[int]] = []
    for row in range(obs.shape[0]):
        queue = waiting.get(row_key(obs[row]))
        if queue:
            episode = queue.popleft()
        else:
            episode = len(members)
            members.append([])
        members[episode].append(row)
        if not bool(terminal[row]):
            waiting.setdefault(row_key(next_obs[row]), deque()).append(episode)
    return [torch.tensor(rows, dtype=torch.long, device="cpu") for rows in members]


def row_key(row: torch.Tensor) -> bytes:
    """A row's identity by its bytes, in 16 bytes however large the row."""
    return hashlib.blake2b(row.contiguous().numpy().tobytes(), digest_size=16).digest()
