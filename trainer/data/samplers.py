"""Which task and which init states a rank works on (seed 001).

- Tasks are sharded round-robin over ranks: task ``i`` goes to rank ``i % world_size``.
- Each iteration a rank works on ONE task, picked by a cursor that advances every
  iteration.
- Init states come from a circular cursor that hands out consecutive states and wraps,
  so every state is used equally often and parallel envs get different states.
"""

from __future__ import annotations

from dataclasses import dataclass, field


class RankWithoutTaskError(ValueError):
    """Raised at startup when a rank would get no task.

    Armature rejects such a configuration instead of letting the rank idle: an idle
    rank would either hang the others' gradient all-reduce or train on nothing.
    """


def shard_tasks(task_ids: list[int], world_size: int) -> list[list[int]]:
    """Round-robin sharding: ``shard_tasks(list(range(9)), 2)`` is
    ``[[0, 2, 4, 6, 8], [1, 3, 5, 7]]``."""
    if world_size < 1:
        raise ValueError("world_size must be at least 1")
    shards: list[list[int]] = [[] for _ in range(world_size)]
    for position, task_id in enumerate(task_ids):
        shards[position % world_size].append(task_id)
    return shards


def tasks_for_rank(task_ids: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's tasks; raises ``RankWithoutTaskError`` if it would have none."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in 0..{world_size - 1}")
    if len(task_ids) < world_size:
        raise RankWithoutTaskError(
            f"env.task_ids has {len(task_ids)} task(s) but there are {world_size} actor "
            f"ranks: ranks {len(task_ids)}..{world_size - 1} would have no task. Use at "
            f"most {len(task_ids)} actor rank(s) or list more tasks."
        )
    return shard_tasks(task_ids, world_size)[rank]


@dataclass
class TaskCursor:
    """Cycles through a rank's tasks, one per iteration."""

    tasks: list[int]
    position: int = 0

    def __post_init__(self) -> None:
        if not self.tasks:
            raise RankWithoutTaskError("a task cursor needs at least one task")

    def current(self) -> int:
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
    sampler: InitStateSampler, task_id: int, num_parallel_envs: int, group_size: int
) -> list[int]:
    """Init-state index for each of the ``num_parallel_envs × group_size`` env slots.

    With ``group_size == 1`` (PPO) every slot gets its own consecutive state. With
    groups (GRPO/RLOO) the cursor hands out ``num_parallel_envs`` states and each is
    run ``group_size`` times in consecutive slots, because a group is defined as
    ``group_size`` rollouts from one init state.
    """
    states = sampler.take(task_id, num_parallel_envs)
    return [state for state in states for _ in range(group_size)]
