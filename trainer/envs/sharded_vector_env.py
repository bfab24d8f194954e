"""One `VectorEnv` whose copies are split into shards, each stepped by a worker in its
own process: an action batch is split by shard, every worker gets its part at once, the
replies are joined in shard order, and each task's init states are read once.

The transport is the only thing a subclass adds: a pipe to a subprocess
(trainer.envs.subproc_vector_env) or a placed Ray actor (trainer.runtime.env_workers).
"""

from __future__ import annotations

import bisect
from abc import abstractmethod
from typing import Any

import numpy as np
import torch

from trainer.envs.vector_env import EnvStep, VectorEnv, concat_steps
from trainer.envs.vision_language import VisionLanguageSpec


def env_facts(env: VectorEnv) -> dict[str, Any]:
    """What every worker's env says about itself, in the shape `ShardedVectorEnv`
    adopts."""
    return {
        "num_tasks": env.num_tasks,
        "obs_shape": env.obs_shape,
        "action_dim": env.action_dim,
        "max_episode_steps": env.max_episode_steps,
        "task_names": [env.task_name(task) for task in range(env.num_tasks)],
        "vision_language": env.vision_language.to_json() if env.vision_language else None,
    }


class ShardedVectorEnv(VectorEnv):
    shard_sizes: list[int]

    # ----- the transport ---------------------------------------------------------------
    @abstractmethod
    def _call_some(self, method: str, args: dict[int, tuple], doing: str) -> list[Any]:
        """`method(*args[i])` on each worker i of `args` at once (and on no other: a
        worker busy stepping a pipeline stage is not waited for); the replies in the
        order of `args`. A worker that fails, dies or does not answer raises
        `EnvWorkerError` naming it."""

    def _call(self, method: str, args: list[tuple], doing: str) -> list[Any]:
        """`method(*args[i])` on every worker i at once; the replies in worker order."""
        return self._call_some(method, dict(enumerate(args)), doing)

    @abstractmethod
    def _call_first(self, method: str, args: tuple, doing: str) -> Any:
        """`method(*args)` on the first worker alone."""

    # ----- the env -----------------------------------------------------------------
    def _adopt(self, facts: dict[str, Any]) -> None:
        """Take the first worker's `env_facts` as this env's."""
        self.num_tasks = facts["num_tasks"]
        self.obs_shape = tuple(facts["obs_shape"])
        self.action_dim = facts["action_dim"]
        self.max_episode_steps = facts["max_episode_steps"]
        self._task_names = facts["task_names"]
        if facts["vision_language"] is not None:
            self.vision_language = VisionLanguageSpec.from_json(facts["vision_language"])
        self._init_states: dict[int, torch.Tensor] = {}

    def init_states(self, task_id: int) -> torch.Tensor:
        if task_id not in self._init_states:  # the same in every shard: read once
            self._init_states[task_id] = self._call_first(
                "init_states", (task_id,), "reading init states"
            )
        return self._init_states[task_id].clone()

    def task_name(self, task_id: int) -> str:
        return self._task_names[task_id]

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        if init_states.shape[0] != self.num_envs:
            raise ValueError(f"init_states must have {self.num_envs} rows")
        parts = torch.split(init_states, self.shard_sizes)
        return torch.cat(self._call("reset", [(task_id, part) for part in parts], "resetting"))

    def step(self, actions: torch.Tensor) -> EnvStep:
        if actions.shape[0] != self.num_envs:
            raise ValueError(f"actions must have {self.num_envs} rows")
        parts = torch.split(actions, self.shard_sizes)
        return concat_steps(self._call("step", [(part,) for part in parts], "stepping"))

    def pictures_from_workers(self, copies: list[int], size: int) -> np.ndarray | None:
        """Pictures of `copies` (the run's numbering, increasing), each made by the worker
        that steps it as `trainer.envs.pictures.pictures_of` makes it there; None when
        the env gives none. Only the workers holding those copies are asked."""
        starts = [sum(self.shard_sizes[:worker]) for worker in range(len(self.shard_sizes))]
        local: dict[int, list[int]] = {}
        for copy in sorted(copies):
            worker = bisect.bisect_right(starts, copy) - 1
            local.setdefault(worker, []).append(copy - starts[worker])
        args = {worker: (held, size) for worker, held in local.items()}
        replies = self._call_some("pictures", args, "picturing copies for videos")
        return None if any(r is None for r in replies) else np.concatenate(replies)
