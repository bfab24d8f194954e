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
    """The chunk each slot executes now, with what is needed to recompute its log-prob."""

    actions: torch.Tensor  # [B, chunk, action_dim] in the model's action dims
    log_prob: torch.Tensor  # [B], sliced from the log-probs computed at planning time
    offsets: torch.Tensor  # [B] long: where the chunk starts in its plan
    horizons: torch.Tensor  # [B] long
    plan_obs: torch.Tensor  # [B, *obs_shape]: the observation the plan was made from


class PlanCache:
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
        self.plan_obs: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.horizons.shape[0])

    def needs_replan(self) -> torch.Tensor:
        return self.offsets >= self.horizons

    def store(
        self,
        which: torch.Tensor,
        plans: torch.Tensor,
        step_log_probs: torch.Tensor,
        obs: torch.Tensor,
    ) -> None:
        """Keep new plans for the slots in the boolean mask ``which``."""
        if self.plans is None:
            batch = self.batch_size
            self.plans = plans.new_zeros(batch, *plans.shape[1:])
            self.step_log_probs = step_log_probs.new_zeros(batch, *step_log_probs.shape[1:])
            self.plan_obs = obs.new_zeros(batch, *obs.shape[1:])
        assert self.step_log_probs is not None and self.plan_obs is not None
        self.plans[which] = plans
        self.step_log_probs[which] = step_log_probs
        self.plan_obs[which] = obs
        self.offsets[which] = 0

    def next_chunk(self) -> ChunkDraw:
        """Slice every slot's chunk at its offset and advance the offsets."""
        if self.plans is None or bool(self.needs_replan().any()):
            raise RuntimeError("some slots need a new plan before the next chunk")
        assert self.step_log_probs is not None and self.plan_obs is not None
        steps = self.offsets.unsqueeze(1) + torch.arange(self.chunk)
        index = steps[:, :, None].expand(-1, -1, self.plans.shape[2])
        draw = ChunkDraw(
            actions=self.plans.gather(1, index),
            log_prob=self.step_log_probs.gather(1, steps).sum(1),
            offsets=self.offsets.clone(),
            horizons=self.horizons.clone(),
            plan_obs=self.plan_obs.clone(),
        )
        self.offsets += self.chunk
        return draw

    def invalidate(self, which: torch.Tensor) -> None:
        """Force a replan for slots whose episode ended (their plan is for a dead episode)."""
        self.offsets[which] = self.horizons[which]
