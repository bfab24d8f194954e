"""Replay buffers for off-policy learning (RLPD, seed 004): fixed capacity, one
preallocated tensor per field, written and sampled in whole batches (no Python object
per transition), and the mixed sampler that draws a fixed share of each batch from the
demo buffer.

A transition is a row of each field: typically `obs`, `action`, `reward`, `next_obs`
(the true final observation when an episode was cut by its time limit), `terminal`
(success ends an episode; a time-out does not: the learner bootstraps from `next_obs`)
and `intervened` (a human chose the action; such rows go into both buffers).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from trainer.devices import to_device_async
from trainer.envs.vector_env import EnvStep

Batch = dict[str, torch.Tensor]
# The fields of a transition, in every buffer alike (a batch mixes two buffers' rows).
TRANSITION_FIELDS = ("obs", "action", "reward", "next_obs", "terminal", "intervened")


class ReplayBuffer:
    """A ring of `capacity` transitions; the oldest are overwritten once it is full.
    The fields and their shapes are fixed by the first batch added."""

    def __init__(self, capacity: int, device: torch.device | str = "cpu") -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be at least 1, not {capacity}")
        self.capacity = capacity
        self.device = torch.device(device)
        self.fields: Batch = {}
        self.cursor = 0  # where the next row goes
        self.size = 0
        self.added = 0  # every row ever added, overwritten ones included

    def __len__(self) -> int:
        return self.size

    def add(self, batch: Mapping[str, torch.Tensor]) -> None:
        """Append a batch of transitions (every field has the same first dimension)."""
        rows = _rows(batch)
        if not self.fields:
            self.fields = {
                name: torch.zeros((self.capacity, *t.shape[1:]), dtype=t.dtype, device=self.device)
                for name, t in batch.items()
            }
        elif set(batch) != set(self.fields):
            raise ValueError(
                f"fields {sorted(batch)} differ from the buffer's {sorted(self.fields)}"
            )
        if rows > self.capacity:  # only the newest `capacity` rows can stay
            batch = {name: t[rows - self.capacity :] for name, t in batch.items()}
            self.added += rows - self.capacity
            rows = self.capacity
        positions = (self.cursor + torch.arange(rows, device=self.device)) % self.capacity
        for name, tensor in batch.items():
            self.fields[name][positions] = to_device_async(tensor, self.device)
        self.cursor = (self.cursor + rows) % self.capacity
        self.size = min(self.capacity, self.size + rows)
        self.added += rows

    def sample(self, count: int, generator: torch.Generator | None = None) -> Batch:
        """`count` transitions drawn uniformly with replacement."""
        index = self.random_rows(count, generator)
        return {name: tensor.index_select(0, index) for name, tensor in self.fields.items()}

    def random_rows(self, count: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """`count` row positions drawn uniformly with replacement, on the buffer's device."""
        if self.size == 0:
            raise ValueError("cannot sample from an empty buffer")
        if generator is not None and generator.device == self.device != torch.device("cpu"):
            # A generator on the buffer's GPU: no copy, no wait for one.
            return torch.randint(self.size, (count,), generator=generator, device=self.device)
        rows = torch.randint(self.size, (count,), generator=generator, device="cpu")
        return rows.to(self.device)

    def ordered(self) -> Batch:
        """The stored rows, oldest first."""
        order = (
            self.cursor - self.size + torch.arange(self.size, device=self.device)
        ) % self.capacity
        return {name: t.index_select(0, order) for name, t in self.fields.items()}

    def state_dict(self) -> dict:
        """The stored rows where they lie in the ring, and the counters: a buffer loaded
        from it samples exactly what this one would."""
        return {
            "capacity": self.capacity,
            "cursor": self.cursor,
            "size": self.size,
            "added": self.added,
            # Cloned: a slice shares the whole preallocated ring, which torch.save would
            # write out in full (21 MB for 1,900 rows of a 100,000-row buffer).
            "fields": {name: t[: self.size].cpu().clone() for name, t in self.fields.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        if state["capacity"] != self.capacity:
            raise ValueError(
                f"snapshot capacity {state['capacity']} differs from the buffer's {self.capacity}"
            )
        self.fields, self.size, self.cursor = {}, 0, 0
        if state["fields"]:
            self.add(state["fields"])  # allocates and fills rows [0, size)
        self.cursor, self.size, self.added = state["cursor"], state["size"], state["added"]


class MixedSampler:
    """Batches drawn `demo_fraction` from the demo buffer and the rest from the online
    buffer, in exact counts (RLPD's 50/50 by default): even when online data outnumber
    the demos a thousand to one, every update sees successful behaviour. While the demo
    buffer is empty (no demo file, no intervention yet) whole batches come from the
    online buffer, as RLPD without prior data is soft actor-critic (`online_only`).

    `fields`: the fields a batch holds (the learner's), none other gathered; by default
    every field, and `from_demo` saying which rows came from the demo buffer."""

    def __init__(
        self,
        online: ReplayBuffer,
        demo: ReplayBuffer,
        batch_size: int,
        demo_fraction: float = 0.5,
        training_starts: int = 0,
        fields: tuple[str, ...] | None = None,
    ) -> None:
        if not 0.0 <= demo_fraction <= 1.0:
            raise ValueError(f"demo_fraction: must be between 0 and 1, not {demo_fraction}")
        self.online, self.demo = online, demo
        self.fields = fields
        self.demo_rows = round(batch_size * demo_fraction)
        self.online_rows = batch_size - self.demo_rows
        self.training_starts = training_starts

    def ready(self) -> bool:
        """Updates wait until the online buffer holds `training_starts` transitions (and
        one at least where a batch takes rows from it)."""
        takes_online = self.online_rows > 0 or self.online_only
        return len(self.online) >= max(self.training_starts, 1 if takes_online else 0)

    @property
    def online_only(self) -> bool:
        """Batches are meant to hold demos but the demo buffer has none yet."""
        return self.demo_rows > 0 and len(self.demo) == 0

    @property
    def demo_share(self) -> float:
        """The share of the next batch drawn from the demo buffer."""
        return 0.0 if self.online_only else self.demo_rows / (self.online_rows + self.demo_rows)

    def sample(self, generator: torch.Generator | None = None) -> Batch:
        """Online rows first, then demo rows."""
        online_rows, demo_rows = self.online_rows, self.demo_rows
        if self.online_only:
            online_rows, demo_rows = online_rows + demo_rows, 0
        parts = [
            (buffer, rows)
            for buffer, rows in ((self.online, online_rows), (self.demo, demo_rows))
            if rows
        ]
        fields = parts[0][0].fields
        if len(parts) == 2 and set(self.demo.fields) != set(fields):
            raise ValueError(
                f"the demo buffer's fields {sorted(self.demo.fields)} differ from the "
                f"online buffer's {sorted(fields)}"
            )
        names = self.fields or tuple(fields)
        missing = [name for name in names if name not in fields]
        if missing:
            raise ValueError(
                f"the buffers hold no field {missing[0]!r}: they hold {sorted(fields)}"
            )
        batch_size = online_rows + demo_rows
        # Each buffer's rows are gathered straight into their half of the batch: no
        # intermediate tensors to concatenate.
        batch = {
            name: fields[name].new_empty((batch_size, *fields[name].shape[1:])) for name in names
        }
        start = 0
        for buffer, rows in parts:
            index = buffer.random_rows(rows, generator)
            for name in names:
                out = batch[name][start : start + rows]
                torch.index_select(buffer.fields[name], 0, index, out=out)
            start += rows
        if self.fields is None:
            device = self.online.device
            batch["from_demo"] = torch.arange(batch_size, device=device) >= online_rows
        return batch


def add_transitions(online: ReplayBuffer, demo: ReplayBuffer, batch: Mapping) -> None:
    """Every transition into the online buffer; those a human chose (`intervened`) into
    the demo buffer as well, so corrections are sampled at the demo share at once."""
    online.add(batch)
    intervened = batch["intervened"].bool()
    if bool(intervened.any()):
        demo.add({name: tensor[intervened] for name, tensor in batch.items()})


def compact_images(observations: torch.Tensor) -> torch.Tensor:
    """Camera frames ([B, C, H, W] floats in [0, 1]) as uint8, a quarter of the memory
    in the buffers and of the traffic from placed workers; state vectors as they are."""
    if observations.dim() == 4 and observations.is_floating_point():
        return observations.mul(255.0).round_().to(torch.uint8)
    return observations


def transition_batch(obs: torch.Tensor, actions: torch.Tensor, step: EnvStep) -> Batch:
    """One env step of every copy as transitions. `next_obs` is the true final
    observation where an episode ended (the env has already reset those copies);
    `terminal` only where it ended in a terminal state, not by the time limit. Images
    are kept as uint8 (`compact_images`)."""
    final = step.final_observation if step.final_observation is not None else step.obs
    next_obs = torch.where(step.done.view(-1, *[1] * (obs.dim() - 1)), final, step.obs)
    intervened = step.intervened
    if intervened is None:
        intervened = torch.zeros(obs.shape[0], dtype=torch.bool)
    applied = step.applied_actions if step.applied_actions is not None else actions
    return {
        "obs": compact_images(obs),
        "action": applied,
        "reward": step.reward,
        "next_obs": compact_images(next_obs),
        "terminal": step.terminated,
        "intervened": intervened,
    }


def _rows(batch: Mapping[str, torch.Tensor]) -> int:
    if not batch:
        raise ValueError("a batch needs at least one field")
    sizes = {name: t.shape[0] for name, t in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"fields have different numbers of rows: {sizes}")
    return next(iter(sizes.values()))
