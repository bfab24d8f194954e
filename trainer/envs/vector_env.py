"""The one vectorised environment interface every env in Armature implements.

Everything is a batch: ``num_envs`` copies step together. Observations, rewards and
flags are torch tensors on the CPU so a rollout never converts between libraries.

Why a chunk axis: a policy sends ``num_action_chunks`` actions per env step (seed 000).
The env executes them in order and stops a copy early when its episode ends, so one
``step`` call is one decision of the policy.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from trainer.envs.vision_language import VisionLanguageSpec


@dataclass(frozen=True)
class EnvStep:
    """What ``VectorEnv.step`` returns for the whole batch.

    ``final_observation`` holds, for copies whose episode ended in this step
    (``terminated | truncated``), the true last observation of that episode, taken
    before the automatic reset; ``obs`` then already is the first observation of the
    next episode. For the other copies the row equals ``obs``.
    """

    obs: torch.Tensor  # [N, *obs_shape]
    reward: torch.Tensor  # [N] float, summed over the executed actions of the chunk
    terminated: torch.Tensor  # [N] bool: the episode reached a terminal state (success)
    truncated: torch.Tensor  # [N] bool: the time limit ended the episode (not terminal)
    success: torch.Tensor  # [N] bool: the task was solved in this step
    executed_actions: torch.Tensor  # [N] long: actions of the chunk actually executed
    # [N, *obs_shape], or None for an env that cannot report it (then the time-out
    # bootstrap falls back to ``obs``)
    final_observation: torch.Tensor | None = None
    # Set by trainer.envs.intervention.InterventionEnv: the actions the env executed
    # [N, action_dim], which copies an operator's input chose the action of [N] (a
    # demonstration), and which a safety rule held still with a zero action [N].
    applied_actions: torch.Tensor | None = None
    intervened: torch.Tensor | None = None
    held: torch.Tensor | None = None
    # A chunk of C actions stepped with an operator: [N, C] bool, which of its executed
    # actions an operator chose, and which a safety rule held (`applied_actions` is then
    # [N, C, action_dim]).
    human_actions: torch.Tensor | None = None
    held_actions: torch.Tensor | None = None

    @property
    def done(self) -> torch.Tensor:
        return self.terminated | self.truncated

    @property
    def info(self) -> dict[str, torch.Tensor]:
        """The gymnasium-style info mapping, for code that expects one."""
        info = {"success": self.success, "executed_actions": self.executed_actions}
        if self.final_observation is not None:
            info["final_observation"] = self.final_observation
        return info


class EnvWorkerError(RuntimeError):
    """A process stepping env copies (a subprocess or a placed Ray worker) died or did not
    answer in time; the message names it, its pid and the reason."""


class VectorEnv(ABC):
    """A batch of ``num_envs`` copies of one environment family.

    ``reset`` puts every copy into a given init state of a given task. When an
    episode ends, the copy resets itself to the same init state (auto-reset) and the
    true final observation is reported in ``EnvStep.final_observation``.
    """

    num_envs: int
    num_tasks: int
    obs_shape: tuple[int, ...]
    action_dim: int
    max_episode_steps: int
    # Set by an env whose observations are packed images, proprio and task id for a
    # vision-language-action policy (trainer.envs.vision_language).
    vision_language: VisionLanguageSpec | None = None

    @abstractmethod
    def init_states(self, task_id: int) -> torch.Tensor:
        """All init states of a task, ``[num_init_states, state_dim]``, fixed per task."""

    @abstractmethod
    def task_name(self, task_id: int) -> str:
        """A human-readable task name (used in logs, never in metric keys)."""

    @abstractmethod
    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        """Reset copy ``i`` to ``init_states[i]`` of ``task_id`` and return the observations."""

    @abstractmethod
    def step(self, actions: torch.Tensor) -> EnvStep:
        """Execute ``actions`` of shape ``[N, chunk, action_dim]`` (or ``[N, action_dim]``)."""

    def restart_workers(self) -> list[str]:
        """Replace env worker processes that died; what was restarted. Envs without
        worker processes have nothing to restart."""
        return []

    def close(self) -> None:  # noqa: B027 - optional hook, most envs hold nothing
        """Release simulator resources; the built-in env holds none."""


def concat_steps(parts: list[EnvStep]) -> EnvStep:
    """One batch's step from its shards' steps, in shard order (env workers' replies),
    with their intervention flags when every shard has them (each wraps its copies)."""
    finals = [part.final_observation for part in parts]
    flags = {}
    if all(part.intervened is not None for part in parts):
        flags = {name: torch.cat([getattr(part, name) for part in parts])
                 for name in ("intervened", "held")}  # fmt: skip
        # A chunk's per-step flags and actions: as long as the longest shard's (one
        # whose copies all ended early stepped fewer), padded with "not stepped".
        if all(part.human_actions is not None for part in parts):
            length = max(part.human_actions.shape[1] for part in parts)
            for name in ("human_actions", "held_actions", "applied_actions"):
                flags[name] = torch.cat([_pad_steps(getattr(p, name), length) for p in parts])
        elif all(part.applied_actions is not None for part in parts):
            flags["applied_actions"] = torch.cat([part.applied_actions for part in parts])
    return EnvStep(
        obs=torch.cat([part.obs for part in parts]),
        reward=torch.cat([part.reward for part in parts]),
        terminated=torch.cat([part.terminated for part in parts]),
        truncated=torch.cat([part.truncated for part in parts]),
        success=torch.cat([part.success for part in parts]),
        executed_actions=torch.cat([part.executed_actions for part in parts]),
        final_observation=None if any(f is None for f in finals) else torch.cat(finals),
        **flags,
    )


def _pad_steps(rows: torch.Tensor, length: int) -> torch.Tensor:
    """[N, C, ...] per-step rows padded with zeros (False) to C = `length`."""
    missing = length - rows.shape[1]
    if not missing:
        return rows
    return torch.cat([rows, rows.new_zeros((rows.shape[0], missing, *rows.shape[2:]))], 1)
