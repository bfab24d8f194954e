"""Per-sample plans for dynamic horizons (seed 000).

Each env slot ``i`` has a planning horizon ``H_i`` (from ``action_horizons_pattern``,
one per group of rollouts, the groups taking the pattern's horizons in turn). The cache
keeps the slot's full plan and an offset; when the offset reaches ``H_i`` the slot
replans; the executed chunk is ``plan[offset : offset + chunk]``. Offsets and horizons
are returned with every chunk so training can recompute exactly the rollout's
log-probabilities (and the critic can value a state at its place in the plan).

Offsets advance by one chunk per decision from 0 at the start of a round, so slot
``i`` replans exactly at the decisions ``t`` where ``t * chunk % H_i == 0``: the
schedule depends only on the horizons. It is worked out once per decision phase
(``t`` modulo the horizons' common period) and reused for every later round with
the same horizons, so a decision costs two copies and two row selections, whatever
the horizons (none where every horizon is the chunk: the plans are the chunks). A
slot whose episode ended keeps its schedule: its rows are invalid from then on (see
``RolloutStorage.finish``), so what it plans is never trained on.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from trainer.devices import to_device_async
from trainer.models.interface import ChunkedPolicy


def assign_horizons(
    pattern: list[int], batch_size: int, group_size: int = 1, first_group: int = 0
) -> torch.Tensor:
    """The horizon of each of ``batch_size`` slots whose consecutive ``group_size`` form
    a group, the first being the run's group ``first_group``: group ``g`` plans with
    ``pattern[g % len(pattern)]``. ``[5, 10, 15]`` for 4 slots is ``[5, 10, 15, 5]``;
    in groups of 2 it is ``[5, 5, 10, 10]``, and from group 2 on ``[15, 15, 5, 5]``.

    One horizon per group: the plan reward favours longer horizons, so a group that
    mixed them would rank its successes by horizon and push the shorter ones down as
    hard as failures. Counted over the run's groups, rounds of fewer groups than
    horizons still use every horizon of the pattern in turn."""
    if not pattern:
        raise ValueError("action_horizons_pattern must not be empty")
    groups = first_group + torch.arange(batch_size, device="cpu") // group_size
    return torch.tensor(pattern, dtype=torch.long, device="cpu")[groups % len(pattern)]


@dataclass(frozen=True)
class ChunkDraw:
    """The chunk each slot executes now, with what is needed to recompute its log-prob
    (together with the observation the plan was made from, which the rollout storage
    finds from the offset: a plan is made at the step where its offset is 0)."""

    actions: torch.Tensor  # [B, chunk, action_dim] in the model's action dims
    log_prob: torch.Tensor  # [B], the chunk's share of the log-probs of its plan
    offsets: torch.Tensor  # [B] long: where the chunk starts in its plan
    horizons: torch.Tensor  # [B] long, the cache's horizons (fixed for its lifetime)
    # [B, L]: the rest of what recomputing the log-prob needs of the plan (a π0's
    # denoising chain); None for policies whose plans say it all.
    plan_latent: torch.Tensor | None = None

    def to(self, device: torch.device) -> ChunkDraw:
        """The same draw on `device` (a rollout worker's draws arrive on the CPU)."""
        fields = (getattr(self, name) for name in self.__dataclass_fields__)
        return ChunkDraw(
            *(None if field is None else to_device_async(field, device) for field in fields)
        )


@dataclass(frozen=True)
class _Phase:
    """Everything one decision phase needs, computed once."""

    replan: torch.Tensor  # [R] long: the slots that plan anew before acting
    replan_horizons: torch.Tensor  # [R] long: their horizons
    plan_steps: int  # the longest of those horizons: how far their plans must go
    offsets: torch.Tensor  # [B] long: where each slot's chunk starts in its plan
    # [B] long: row ``slot * chunks_per_plan + offset // chunk`` of the plans seen as
    # one row per chunk. Selecting rows from that flat view is a few times faster on
    # the CPU than a gather along the step axis with an expanded index.
    chunk_rows: torch.Tensor


class PlanCache:
    """The plans of one batch of slots, walked one chunk per decision.

    Per decision: ``replan_slots()`` names the slots to plan for, ``store()`` keeps
    their new plans, ``next_chunk()`` slices every slot's chunk and moves on.
    ``restart()`` begins a new round (offsets back to 0) and keeps the schedule.
    """

    def __init__(
        self,
        horizons: torch.Tensor,
        chunk: int,
        max_horizon: int,
        device: torch.device | str = "cpu",
    ) -> None:
        """`horizons` on the CPU; the plans and every index live on `device`. The
        schedule is worked out on the CPU, so walking it never waits for the device."""
        if bool((horizons % chunk != 0).any()):
            raise ValueError(f"every horizon must be a multiple of the chunk size {chunk}")
        if int(horizons.max()) > max_horizon:
            raise ValueError(f"horizons exceed the policy's max horizon {max_horizon}")
        if max_horizon % chunk:
            raise ValueError(f"the max horizon {max_horizon} must be a multiple of {chunk}")
        self.schedule_horizons = horizons.cpu().clone()
        self.device = torch.device(device)
        self.horizons = self.schedule_horizons.to(self.device)
        self.chunk = chunk
        self.max_horizon = max_horizon
        self.period = math.lcm(*(h // chunk for h in set(self.schedule_horizons.tolist())))
        self.chunks_per_plan = max_horizon // chunk
        # Every phase worked out now, when a round starts: a round whose horizons moved
        # over the slots (SpareCaches) makes a new cache, and its steps must still
        # read nothing back from the device.
        self._phases = {key: self._make_phase(key) for key in range(self.period)}
        self.plans: torch.Tensor | None = None  # [B, max_horizon, action_dim]
        self.chunk_log_probs: torch.Tensor | None = None  # [B, chunks_per_plan]
        self.plan_latents: torch.Tensor | None = None  # [B, L], for policies that have one
        self.restart()

    @property
    def batch_size(self) -> int:
        return int(self.horizons.shape[0])

    def same_schedule(self, horizons: torch.Tensor, chunk: int, max_horizon: int) -> bool:
        return (
            chunk == self.chunk
            and max_horizon == self.max_horizon
            and torch.equal(horizons.cpu(), self.schedule_horizons)
        )

    def restart(self) -> None:
        """A new round: every slot plans before its first chunk."""
        self.decision = 0
        self._stored_at = -1
        self._whole: tuple[torch.Tensor, torch.Tensor, torch.Tensor | None] | None = None

    def phase_key(self) -> int:
        """The phase of the next decision: decisions of one phase replan the same slots
        to the same length and take the same chunks of their plans."""
        return self.decision % self.period

    def position(self) -> tuple[int, int]:
        """Where the walk is, for `go_to`."""
        return self.decision, self._stored_at

    def go_to(self, position: tuple[int, int]) -> None:
        self.decision, self._stored_at = position
        self._whole = None

    def advance(self) -> None:
        """The walk's step over a decision whose `store` and `next_chunk` ran on the
        device without their Python (a replayed CUDA graph of them)."""
        self.go_to((self.decision + 1, self.decision))

    def replan_slots(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The slots that need a new plan before this decision, their horizons, and
        how many steps their plans need (the longest of those horizons)."""
        phase = self._phase()
        return phase.replan, phase.replan_horizons, phase.plan_steps

    def store(
        self,
        which: torch.Tensor,
        plans: torch.Tensor,
        chunk_log_probs: torch.Tensor,
        plan_latents: torch.Tensor | None = None,
    ) -> None:
        """Keep new plans ``[R, S, action_dim]``, the log-prob of each of their chunks
        ``[R, S // chunk]`` (and their latents ``[R, L]``, where the policy has them) for
        the slots ``which`` (indices). ``S`` may stop short of the max horizon at any
        multiple of the chunk that covers the slots' horizons: steps past a slot's
        horizon are never executed."""
        steps = plans.shape[1]
        if steps % self.chunk or steps > self.max_horizon:
            raise ValueError(
                f"plans of {steps} steps: use a multiple of {self.chunk} up to {self.max_horizon}"
            )
        self._stored_at = self.decision
        if steps == self.chunk and which.shape[0] == self.batch_size:
            # Every slot's plan is one chunk, all made now (every horizon is the chunk):
            # the plans are this decision's chunks as they are, with nothing to copy in
            # or select out (on a GPU, four kernel launches a decision saved).
            self._whole = (plans, chunk_log_probs, plan_latents)
            return
        if self.plans is None or self.plans.shape[2] != plans.shape[2]:
            batch = self.batch_size
            self.plans = plans.new_zeros(batch, self.max_horizon, plans.shape[2])
            self.chunk_log_probs = chunk_log_probs.new_zeros(batch, self.chunks_per_plan)
        assert self.chunk_log_probs is not None
        self.plans[:, :steps].index_copy_(0, which, plans)
        self.chunk_log_probs[:, : steps // self.chunk].index_copy_(0, which, chunk_log_probs)
        if plan_latents is not None:
            if self.plan_latents is None or self.plan_latents.shape[1] != plan_latents.shape[1]:
                self.plan_latents = plan_latents.new_zeros(self.batch_size, plan_latents.shape[1])
            self.plan_latents.index_copy_(0, which, plan_latents)

    def next_chunk(self) -> ChunkDraw:
        """Slice every slot's chunk at its offset and move to the next decision."""
        phase = self._phase()
        if self._stored_at != self.decision and phase.replan.numel():
            raise RuntimeError("some slots need a new plan before the next chunk")
        if self._whole is not None:
            plans, chunk_log_probs, latents = self._whole
            self._whole = None
            self.decision += 1
            return ChunkDraw(plans, chunk_log_probs.view(-1), phase.offsets, self.horizons, latents)
        assert self.plans is not None and self.chunk_log_probs is not None
        batch, _, action_dim = self.plans.shape
        chunks = self.plans.view(batch * self.chunks_per_plan, self.chunk * action_dim)
        draw = ChunkDraw(
            actions=chunks.index_select(0, phase.chunk_rows).view(batch, self.chunk, action_dim),
            log_prob=self.chunk_log_probs.view(-1).index_select(0, phase.chunk_rows),
            offsets=phase.offsets,
            horizons=self.horizons,
            # Each slot's plan's latent, copied: the next plans are stored over it.
            plan_latent=None if self.plan_latents is None else self.plan_latents.clone(),
        )
        self.decision += 1
        return draw

    def _phase(self) -> _Phase:
        return self._phases[self.phase_key()]

    def _make_phase(self, key: int) -> _Phase:
        offsets = (key * self.chunk) % self.schedule_horizons
        replan = (offsets == 0).nonzero().squeeze(1)
        replan_horizons = self.schedule_horizons.index_select(0, replan)
        slots = torch.arange(self.batch_size, device="cpu")
        device = self.device
        return _Phase(
            replan=replan.to(device),
            replan_horizons=replan_horizons.to(device),
            plan_steps=int(replan_horizons.max()) if replan.numel() else 0,
            offsets=offsets.to(device),
            chunk_rows=(slots * self.chunks_per_plan + offsets // self.chunk).to(device),
        )


class SpareCaches:
    """Plan caches put aside by rounds of other horizons, kept for the next round that
    has theirs. Groups take the pattern's horizons in turn over the run, so unless the
    groups of a round are a multiple of the pattern's length, consecutive rounds shift
    the horizons over the slots; the few schedules that makes come round again, and
    each keeps its worked-out phases (and a GPU's captured decisions) instead of being
    made anew every round. A cache belongs to one rollout at a time: only the one a
    rollout gives up is put aside, and a cache taken is no longer spare."""

    def __init__(self) -> None:
        self._spare: dict[tuple[tuple[int, ...], int, int], PlanCache] = {}

    def cache_for_round(
        self,
        current: PlanCache | None,
        horizons: torch.Tensor,
        chunk: int,
        max_horizon: int,
        device: torch.device | str,
    ) -> PlanCache:
        """The cache for a round of ``horizons``, restarted: ``current`` when it has
        their schedule, else a spare one that has it, else a new one; a ``current``
        of another schedule is put aside."""
        if current is not None and current.same_schedule(horizons, chunk, max_horizon):
            current.restart()
            return current
        if current is not None:
            key = self._key(current.schedule_horizons, current.chunk, current.max_horizon)
            self._spare[key] = current
        cache = self._spare.pop(self._key(horizons, chunk, max_horizon), None)
        if cache is None:
            return PlanCache(horizons, chunk, max_horizon, device)
        cache.restart()
        return cache

    @staticmethod
    def _key(
        horizons: torch.Tensor, chunk: int, max_horizon: int
    ) -> tuple[tuple[int, ...], int, int]:
        return tuple(horizons.tolist()), chunk, max_horizon


def decide(policy: ChunkedPolicy, cache: PlanCache, obs: torch.Tensor, chunk: int) -> ChunkDraw:
    """One decision: new plans for the slots whose plan is used up, then every slot's
    next chunk of its plan."""
    replan, horizons, plan_steps = cache.replan_slots()
    if replan.numel():
        plan_obs = obs if replan.numel() == obs.shape[0] else obs.index_select(0, replan)
        if getattr(policy, "plan_latent_size", 0):
            planned = policy.sample_plan_with_latent(  # type: ignore[attr-defined]
                plan_obs, horizons, steps=plan_steps, chunk=chunk
            )
        else:
            planned = policy.sample_plan(plan_obs, horizons, steps=plan_steps, chunk=chunk)
        cache.store(replan, *planned)
    return cache.next_chunk()
