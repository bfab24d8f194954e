"""Rollout storage, minibatching, the task / init-state samplers, and the replay
buffers of off-policy learning."""

from trainer.data.replay import MixedSampler, ReplayBuffer, add_transitions
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
    "MixedSampler",
    "ReplayBuffer",
    "RolloutStorage",
    "TaskCursor",
    "Trajectories",
    "Transition",
    "add_transitions",
    "concat_trajectories",
    "minibatches",
    "round_init_state_indices",
    "shard_tasks",
]
