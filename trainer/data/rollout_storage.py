"""Rollout storage: one decision (chunk step) per row, step-major ``[T, B]``.

Collection is episodic: each of the ``B`` env slots runs exactly one episode from its
init state (the multi-task sampling of seed 001 needs whole trajectories). A slot keeps
being stepped by the vectorised env after its episode ended; those rows are marked
invalid and never reach the loss. ``T`` is the longest possible episode in chunk steps,
so rounds of the same config always have the same ``T`` and concatenate along ``B``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, fields, replace

import torch

from trainer.devices import to_device_async

STEP_FIELDS = (
    "obs",
    "plan_obs",
    "actions",
    "chunk_offset",
    "plan_horizon",
    "log_prob",
    "value",
    "reward",
    "env_reward",
    "done",
    "timeout",
    "success",
    "executed_actions",
    "intervened",
    "held",
    "valid",
    "advantage",
    "returns",
    "plan_latent",
)
EPISODE_FIELDS = (
    "task_id",
    "init_state_index",
    "group_index",
    "horizon",
    "episode_success",
    "episode_return",
    "episode_length",
    "loss_mask",
)
# What the update reads; everything else (episode stats, log-only scalars) stays out
# of minibatch splitting by construction.
TRAINING_KEYS = (
    "obs",
    "plan_obs",
    "actions",
    "chunk_offset",
    "plan_horizon",
    "log_prob",
    "value",
    "advantage",
    "returns",
    "weight",
    "policy_weight",
    "plan_latent",
)


# A step's per-copy numbers, in the order of a transition's `per_copy` rows: they cross
# from the CPU envs in one copy, as floats, and take their types once per round. The
# flags come last, side by side, so that one conversion types them all.
PER_COPY = (
    "reward",  # env reward plus the time-out bootstrap
    "env_reward",
    "executed_actions",
    "done",
    "timeout",
    "success",
    # An operator's input chose the env's action (`intervened`), or a safety rule held
    # the copy still with a zero action (`held`): either way the policy's own draw was
    # not executed, so the row stays out of the policy-gradient loss (`policy_weight`).
    "intervened",
    "held",
)
FIRST_FLAG = PER_COPY.index("done")


@dataclass
class Transition:
    """What one chunk step adds for all ``B`` slots.

    Only what changes per step: the plan's observation, the slot's horizon and the
    critic's value are filled in by ``RolloutStorage.finish`` and the algorithm once
    per round, off the per-decision path. ``plan_latent`` is what else recomputing the
    chunk's log-prob needs of its plan ([B, L]; a π0's denoising chain, nothing for
    other policies).
    """

    obs: torch.Tensor
    actions: torch.Tensor
    chunk_offset: torch.Tensor
    log_prob: torch.Tensor
    per_copy: torch.Tensor  # [len(PER_COPY), B] float: the step's numbers, one row each
    plan_latent: torch.Tensor | None = None

    @classmethod
    def of(
        cls,
        obs: torch.Tensor,
        actions: torch.Tensor,
        chunk_offset: torch.Tensor,
        log_prob: torch.Tensor,
        **per_copy: torch.Tensor,
    ) -> Transition:
        """A transition from each of the step's numbers by its name in `PER_COPY`."""
        rows = torch.stack([per_copy[name].to(obs.device, torch.float32) for name in PER_COPY])
        return cls(obs, actions, chunk_offset, log_prob, rows)

    def number(self, name: str) -> torch.Tensor:
        """The step's per-copy `name` (one of `PER_COPY`) [B], as the float it crossed in."""
        return self.per_copy[PER_COPY.index(name)]


@dataclass
class Trajectories:
    """``B`` finished episodes. Step fields are ``[T, B, ...]``, episode fields ``[B]``."""

    obs: torch.Tensor
    plan_obs: torch.Tensor
    actions: torch.Tensor
    chunk_offset: torch.Tensor
    plan_horizon: torch.Tensor
    log_prob: torch.Tensor
    value: torch.Tensor
    reward: torch.Tensor
    env_reward: torch.Tensor
    done: torch.Tensor
    timeout: torch.Tensor
    success: torch.Tensor
    executed_actions: torch.Tensor
    intervened: torch.Tensor
    held: torch.Tensor
    valid: torch.Tensor
    advantage: torch.Tensor
    returns: torch.Tensor
    task_id: torch.Tensor
    init_state_index: torch.Tensor
    group_index: torch.Tensor
    horizon: torch.Tensor
    episode_success: torch.Tensor
    episode_return: torch.Tensor
    episode_length: torch.Tensor
    loss_mask: torch.Tensor
    # [T, B, L]: what recomputing a chunk's log-prob needs of its plan besides its
    # observation (a π0's denoising chain); L = 0 for the other policies.
    plan_latent: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.plan_latent is None:
            self.plan_latent = self.obs.new_zeros(*self.obs.shape[:2], 0)

    @property
    def num_episodes(self) -> int:
        return int(self.task_id.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.obs.shape[0])

    @property
    def not_the_policys(self) -> torch.Tensor:
        """``[T, B]``: rows whose executed action the policy did not choose (an
        operator's, or a safety hold's zero action)."""
        return self.intervened | self.held

    @property
    def assisted(self) -> torch.Tensor:
        """``[B]``: the policy did not choose every one of the episode's steps."""
        return (self.not_the_policys & self.valid).any(0)

    @property
    def policy_success(self) -> torch.Tensor:
        """``[B]``: what the policy achieved on its own. An episode a human helped
        counts as a failure for the policy, whatever its outcome (docs/training.md,
        "Human steps")."""
        return self.episode_success & ~self.assisted

    def select(self, episodes: torch.Tensor) -> Trajectories:
        """The episodes at ``episodes`` (indices or a boolean mask), in that order."""
        values = {name: getattr(self, name)[:, episodes] for name in STEP_FIELDS}
        values |= {name: getattr(self, name)[episodes] for name in EPISODE_FIELDS}
        return Trajectories(**values)

    def with_loss_mask(self, loss_mask: torch.Tensor) -> Trajectories:
        return replace(self, loss_mask=loss_mask.to(self.loss_mask.device, torch.float32))

    def last_step_index(self) -> torch.Tensor:
        """Row of each episode's final decision ``[B]``."""
        return (self.valid.long().sum(0) - 1).clamp(min=0)

    def training_samples(self) -> dict[str, torch.Tensor]:
        """Valid rows flattened to ``[N, ...]``, with the loss weight of each row, and its
        weight in the policy-gradient terms (0 where the policy did not choose the
        action: a human's step or a safety hold)."""
        valid = self.valid
        # The valid rows found once (one read of the device), then selected from each
        # field's [T * B] rows: a boolean mask per field would find them again each time.
        rows = valid.reshape(-1).nonzero().squeeze(1)

        def selected(values: torch.Tensor) -> torch.Tensor:
            return values.flatten(0, 1).index_select(0, rows)  # also with no columns

        weight = self.loss_mask[None, :].expand_as(valid).to(torch.float32)
        columns = {
            name: selected(getattr(self, name))
            for name in TRAINING_KEYS
            if name not in ("weight", "policy_weight")
        }
        columns["weight"] = selected(weight)
        columns["policy_weight"] = selected(weight * ~self.not_the_policys)
        return columns


def empty_training_samples(
    obs_shape: tuple[int, ...],
    chunk: int,
    action_dim: int,
    device: torch.device | str = "cpu",
    latent_size: int = 0,
) -> dict[str, torch.Tensor]:
    """No training rows, shaped like real ones: what a rank without a task this
    iteration trains on while it joins the others' gradient sync."""
    rows = {name: torch.zeros(0, device=device) for name in TRAINING_KEYS}
    rows["obs"] = rows["plan_obs"] = torch.zeros(0, *obs_shape, device=device)
    rows["actions"] = torch.zeros(0, chunk, action_dim, device=device)
    rows["plan_latent"] = torch.zeros(0, latent_size, device=device)
    long = torch.zeros(0, dtype=torch.long, device=device)
    rows["chunk_offset"] = rows["plan_horizon"] = long
    return rows


def concat_trajectories(parts: list[Trajectories]) -> Trajectories:
    if not parts:
        raise ValueError("nothing to concatenate")
    values = {}
    for item in fields(Trajectories):
        dim = 1 if item.name in STEP_FIELDS else 0
        values[item.name] = torch.cat([getattr(part, item.name) for part in parts], dim=dim)
    return Trajectories(**values)


class RolloutStorage:
    """Collects ``Transition``s of one round and turns them into ``Trajectories``."""

    def __init__(
        self, num_steps: int, num_envs: int, chunk: int = 1, device: torch.device | str = "cpu"
    ) -> None:
        """`device`: where the transitions are (what the algorithm adds) and where the
        finished trajectories are made."""
        self.num_steps = num_steps
        self.num_envs = num_envs
        self.chunk = chunk
        self.device = torch.device(device)
        self._rows: list[Transition] = []

    @property
    def step(self) -> int:
        return len(self._rows)

    def add(self, transition: Transition) -> None:
        if self.step >= self.num_steps:
            raise RuntimeError(f"rollout storage overflow: it holds {self.num_steps} steps")
        self._rows.append(transition)

    def clear(self) -> None:
        self._rows = []

    def finish(
        self,
        task_id: int,
        init_state_index: torch.Tensor,
        group_index: torch.Tensor,
        horizon: torch.Tensor,
    ) -> Trajectories:
        """Stack the round, mark each slot's rows after its first ``done`` invalid and
        summarise each episode. Missing rows (all slots finished early) are padded.

        A plan is made at the step where its chunk offset is 0, so the observation it
        was made from is the stored observation ``offset / chunk`` steps back; the
        values are left at 0 for the algorithm's critic (``attach_values``)."""
        if not self._rows:
            raise RuntimeError("no steps were stored")
        # On a GPU each op is a kernel launch from Python, which costs more than a
        # round's worth of its arithmetic: the per-copy numbers are stacked, masked and
        # typed together, not field by field.
        stacked = {
            name: torch.stack([getattr(row, name) for row in self._rows])
            for name in ("obs", "actions", "chunk_offset", "log_prob", "per_copy")
        }
        if self._rows[0].plan_latent is not None:
            stacked["plan_latent"] = torch.stack([row.plan_latent for row in self._rows])
        padding = self.num_steps - self.step
        if padding:
            for name, value in stacked.items():
                pad = value.new_zeros(padding, *value.shape[1:])
                if name == "per_copy":
                    pad[:, FIRST_FLAG] = 1.0  # done
                stacked[name] = torch.cat([value, pad])
        per_copy = stacked.pop("per_copy")  # [T, len(PER_COPY), B]
        done = per_copy[:, FIRST_FLAG]
        valid = done.cumsum(0) == done  # no episode ended before the row
        # Rows after the episode are dead: no reward, no value, no flag but done, so
        # that discounting never crosses into them.
        per_copy = per_copy * valid.unsqueeze(1)
        flags = per_copy[:, FIRST_FLAG:].bool().unbind(1)
        numbers = dict(zip(PER_COPY[:FIRST_FLAG], per_copy[:, :FIRST_FLAG].unbind(1), strict=True))
        numbers |= dict(zip(PER_COPY[FIRST_FLAG:], flags, strict=True))
        numbers["executed_actions"] = numbers["executed_actions"].long()
        numbers["done"] = numbers["done"] | ~valid
        device, batch = self.device, self.num_envs
        # A plan is made at the step where its offset is 0: the plan's observation is
        # `offset / chunk` steps back, a row of the flattened [T * B] observations (row
        # selection copies whole observations, several times faster on the CPU than a
        # gather over T).
        obs = stacked["obs"]
        rows = torch.arange(self.num_steps * batch, device=device).view(self.num_steps, batch)
        rows = (rows - stacked["chunk_offset"] // self.chunk * batch).clamp_(min=0)
        plan_obs = obs.view(-1, *obs.shape[2:]).index_select(0, rows.view(-1)).view(obs.shape)
        zeros = torch.zeros(3, self.num_steps, batch, device=device).unbind(0)
        return Trajectories(
            **stacked,
            **numbers,
            plan_obs=plan_obs,
            plan_horizon=horizon.long().expand(self.num_steps, -1).clone(),
            valid=valid,
            value=zeros[0],
            advantage=zeros[1],
            returns=zeros[2],
            task_id=torch.full((batch,), task_id, dtype=torch.long, device=device),
            init_state_index=init_state_index.long(),
            group_index=group_index.long(),
            horizon=horizon.long(),
            episode_success=numbers["success"].any(0),
            episode_return=numbers["env_reward"].sum(0),
            episode_length=numbers["executed_actions"].sum(0),
            loss_mask=torch.ones(batch, device=device),
        )


Layout = tuple[tuple[str, torch.dtype, int, int, tuple[int, ...]], ...]


class PackedRows:
    """Training samples with the columns of each dtype packed side by side, so a
    minibatch is one row selection per dtype and its columns are views: on a GPU, where
    an update of a small network is bound by how many kernels it launches, a dozen
    selections per minibatch cost more than the arithmetic."""

    def __init__(self, samples: dict[str, torch.Tensor]) -> None:
        first = next(iter(samples.values()))
        self.count = first.shape[0]
        self.device = first.device
        layout = []
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for name, value in samples.items():
            columns = by_dtype.setdefault(value.dtype, [])
            start = sum(c.shape[1] for c in columns)
            flat = value.reshape(self.count, math.prod(value.shape[1:]))  # also with no rows
            columns.append(flat)
            layout.append((name, value.dtype, start, flat.shape[1], tuple(value.shape[1:])))
        # (name, dtype, first column, columns, shape of a row): equal for every
        # iteration of a run, so it also keys what is built for one (e.g. a CUDA graph).
        self.layout: Layout = tuple(layout)
        self.tables = {
            dtype: columns[0] if len(columns) == 1 else torch.cat(columns, dim=1)
            for dtype, columns in by_dtype.items()
        }

    def shuffled_parts(
        self, parts: int, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, ...]:
        """The row indices shuffled and split into `parts` near-equal parts (some empty
        when there are fewer rows). Drawn on the CPU (`generator` is a CPU generator):
        the same shuffle on any device."""
        order = torch.randperm(self.count, generator=generator, device="cpu")
        return torch.tensor_split(to_device_async(order, self.device), parts)

    def select(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The samples of `rows`."""
        # index_select: several times faster than advanced indexing on CPU
        return self.views(
            {dtype: table.index_select(0, rows) for dtype, table in self.tables.items()}
        )

    def empty(self, rows: int) -> dict[torch.dtype, torch.Tensor]:
        """Tables for `rows` rows, to `select_into`."""
        return {
            dtype: torch.empty(rows, table.shape[1], dtype=dtype, device=self.device)
            for dtype, table in self.tables.items()
        }

    def select_into(self, rows: torch.Tensor, tables: dict[torch.dtype, torch.Tensor]) -> None:
        """The rows `rows` written into `tables` (from `empty`) in place."""
        for dtype, table in self.tables.items():
            torch.index_select(table, 0, rows, out=tables[dtype])

    def views(self, tables: dict[torch.dtype, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Each sample column of `tables` by its name and shape."""
        return {  # rows counted from the table: a column of no width has no -1 to infer
            name: tables[dtype][:, start : start + width].view(tables[dtype].shape[0], *shape)
            for name, dtype, start, width, shape in self.layout
        }


def minibatches(
    samples: dict[str, torch.Tensor],
    num_minibatches: int,
    generator: torch.Generator | None = None,
    keep_empty: bool = False,
) -> Iterator[dict[str, torch.Tensor]]:
    """Shuffle the rows and split them into ``num_minibatches`` near-equal parts
    (with ``keep_empty``, always that many, some empty when there are fewer rows)."""
    packed = PackedRows(samples)
    for part in packed.shuffled_parts(num_minibatches, generator):
        if part.numel() or keep_empty:
            yield packed.select(part)
