"""Which task and which init states a rank works on (seed 001).

- Tasks are sharded round-robin over ranks: task ``i`` goes to rank ``i % world_size``.
- Each iteration a rank works on ONE task, picked by a cursor that advances every
  iteration.
- Init states come from a circular cursor that hands out consecutive states and wraps,
  so every state is used equally often and parallel envs get different states.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def shard_tasks(task_ids: list[int], world_size: int) -> list[list[int]]:
    """Round-robin sharding: ``shard_tasks(list(range(9)), 2)`` is
    ``[[0, 2, 4, 6, 8], [1, 3, 5, 7]]``; with more ranks than tasks the last ranks get
    ``[]`` (seed 001's ``rank1: []``)."""
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for position, task_id in enumerate(task_ids):
        shards[position % world_size].append(task_id)
    return shards


@dataclass
class TaskCursor:
    """Cycles through a rank's tasks, one per iteration; ``None`` for a rank without
    tasks, which idles every iteration (and still joins the gradient sync)."""

    tasks: list[int]
    position: int = 0

    def current(self) -> int | None:
        if not self.tasks:
            return None
        return self.tasks[self.position % len(self.tasks)]

    def advance(self) -> None:
        self.position += 1


@dataclass
class CircularCursor:
    """Hands out ``count`` consecutive indices into ``size`` items, wrapping around.

    ``CircularCursor(10)``: ``take(4)`` three times gives ``[0, 1, 2, 3]``,
    ``[4, 5, 6, 7]``, ``[8, 9, 0, 1]``.
    """

    size: int
    position: int = 0

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError("a circular cursor needs at least one item")

    def take(self, count: int) -> list[int]:
        indices = [(self.position + offset) % self.size for offset in range(count)]
        self.position = (self.position + count) % self.size
        return indices


@dataclass
class InitStateSampler:
    """One circular cursor per task, so switching tasks never skips states."""

    states_per_task: dict[int, int]
    cursors: dict[int, CircularCursor] = field(default_factory=dict)

    def take(self, task_id: int, count: int) -> list[int]:
        if task_id not in self.cursors:
            self.cursors[task_id] = CircularCursor(self.states_per_task[task_id])
        return self.cursors[task_id].take(count)

    def state_dict(self) -> dict[int, int]:
        return {task_id: cursor.position for task_id, cursor in self.cursors.items()}

    def load_state_dict(self, positions: dict[int, int]) -> None:
        self.cursors = {
            int(task_id): CircularCursor(self.states_per_task[int(task_id)], position)
            for task_id, position in positions.items()
        }


def round_init_state_indices(
    sampler: InitStateSampler,
    task_id: int,
    num_parallel_envs: int,
    group_size: int,
    mode: str = "per_group",
) -> list[int]:
    """Init-state index for each of the ``num_parallel_envs × group_size`` env slots.

    ``per_rollout`` (seed 001): the cursor hands out ``num_parallel_envs × group_size``
    consecutive states, one per slot. ``per_group``: it hands out ``num_parallel_envs``
    states and each is run ``group_size`` times in consecutive slots, so a group's
    rollouts differ by the policy's sampling, not by where they started — what
    GRPO's and RLOO's group-relative baselines compare. With ``group_size == 1`` the
    two are the same.
    """
    if mode == "per_rollout":
        return sampler.take(task_id, num_parallel_envs * group_size)
    if mode != "per_group":
        raise ValueError(f"unknown init-state mode {mode!r}: per_group or per_rollout")
    states = sampler.take(task_id, num_parallel_envs)
    return [state for state in states for _ in range(group_size)]
