"""Rollout storage, minibatching and the task / init-state samplers."""

from trainer.data.rollout_storage import (
    TRAINING_KEYS,
    RolloutStorage,
    Trajectories,
    Transition,
    concat_trajectories,
    minibatches,
)
from trainer.data.samplers import (
    CircularCursor,
    InitStateSampler,
    TaskCursor,
    round_init_state_indices,
    shard_tasks,
)

__all__ = [
    "TRAINING_KEYS",
    "CircularCursor",
    "InitStateSampler",
    "RolloutStorage",
    "TaskCursor",
    "Trajectories",
    "Transition",
    "concat_trajectories",
    "minibatches",
    "round_init_state_indices",
    "shard_tasks",
]
