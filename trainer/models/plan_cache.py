"""Per-sample plans for dynamic horizons (seed 000).

Each env slot ``i`` has a planning horizon ``H_i`` (from ``action_horizons_pattern``,
assigned cyclically over the batch). The cache keeps the slot's full plan and an
offset; when the offset reaches ``H_i`` the slot replans; the executed chunk is
``plan[offset : offset + chunk]``. Offsets and horizons are returned with every chunk
so training can recompute exactly the rollout's log-probabilities.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


def assign_horizons(pattern: list[int], batch_size: int) -> torch.Tensor:
    """``pattern`` repeated over the batch: ``[5, 10, 15]`` for 4 slots is ``[5, 10, 15, 5]``."""
    if not pattern:
        raise ValueError("action_horizons_pattern must not be empty")
    return torch.tensor([pattern[i % len(pattern)] for i in range(batch_size)], dtype=torch.long)


@dataclass(frozen=True)
class ChunkDraw:
    """The chunk each slot executes now, with what is needed to recompute its log-prob
    (together with the observation the plan was made from, which the rollout storage
    finds from the offset: a plan is made at the step where its offset is 0)."""

    actions: torch.Tensor  # [B, chunk, action_dim] in the model's action dims
    log_prob: torch.Tensor  # [B], sliced from the log-probs computed at planning time
    offsets: torch.Tensor  # [B] long: where the chunk starts in its plan
    horizons: torch.Tensor  # [B] long, the cache's horizons (fixed for its lifetime)


class PlanCache:
    """Runs once per decision of every rollout: each method is a handful of whole-batch
    tensor ops (index lists rather than boolean masks, no per-slot Python), because on a
    fast env their fixed cost per call is what the rollout loop adds to the env."""

    def __init__(self, horizons: torch.Tensor, chunk: int, max_horizon: int) -> None:
        if bool((horizons % chunk != 0).any()):
            raise ValueError(f"every horizon must be a multiple of the chunk size {chunk}")
        if int(horizons.max()) > max_horizon:
            raise ValueError(f"horizons exceed the policy's max horizon {max_horizon}")
        self.horizons = horizons.clone()
        self.chunk = chunk
        self.max_horizon = max_horizon
        self.offsets = self.horizons.clone()  # offset == H means "replan before acting"
        self.plans: torch.Tensor | None = None
        self.step_log_probs: torch.Tensor | None = None
        self._chunk_steps = torch.arange(chunk)

    @property
    def batch_size(self) -> int:
        return int(self.horizons.shape[0])

    def needs_replan(self) -> torch.Tensor:
        return self.offsets >= self.horizons

    def store(self, which: torch.Tensor, plans: torch.Tensor, step_log_probs: torch.Tensor) -> None:
        """Keep new plans for the slots ``which`` (indices, or a boolean mask)."""
        if which.dtype == torch.bool:
            which = which.nonzero().squeeze(1)
        if self.plans is None:
            batch = self.batch_size
            self.plans = plans.new_zeros(batch, *plans.shape[1:])
            self.step_log_probs = step_log_probs.new_zeros(batch, *step_log_probs.shape[1:])
        assert self.step_log_probs is not None
        self.plans.index_copy_(0, which, plans)
        self.step_log_probs.index_copy_(0, which, step_log_probs)
        self.offsets.index_fill_(0, which, 0)

    def next_chunk(self) -> ChunkDraw:
        """Slice every slot's chunk at its offset and advance the offsets.

        Every slot must hold a plan with room left (``needs_replan()`` all false): the
        rollout replans those slots first, in the same call.
        """
        if self.plans is None:
            raise RuntimeError("some slots need a new plan before the next chunk")
        assert self.step_log_probs is not None
        offsets = self.offsets
        steps = offsets.unsqueeze(1) + self._chunk_steps
        index = steps.unsqueeze(2).expand(-1, -1, self.plans.shape[2])
        draw = ChunkDraw(
            actions=self.plans.gather(1, index),
            log_prob=self.step_log_probs.gather(1, steps).sum(1),
            offsets=offsets,
            horizons=self.horizons,
        )
        self.offsets = offsets + self.chunk  # a new tensor: the draw keeps its offsets
        return draw

    def invalidate(self, which: torch.Tensor) -> None:
        """Force a replan for slots whose episode ended (their plan is for a dead episode)."""
        self.offsets = torch.where(which, self.horizons, self.offsets)
