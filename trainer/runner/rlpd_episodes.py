"""One round of RLPD's acting: every env copy runs one episode of a task, each step's
transitions handed on as they happen. The same loop runs in the learner's process (the
transitions go straight into its buffers) and in a placed env worker (they are sent to
the learner: trainer.runtime.rlpd_split)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trainer.data.replay import Batch, transition_batch
from trainer.envs.vector_env import VectorEnv
from trainer.videos.capture import RoundCapture


@dataclass
class EpisodeStats:
    """Per copy: whether it succeeded, its return, length, the steps a human chose and
    the steps a safety rule held it still."""

    success: torch.Tensor
    returns: torch.Tensor
    lengths: torch.Tensor
    intervened_steps: torch.Tensor
    held_steps: torch.Tensor
    # Updates the learner made between the weights the copies acted with and its own at
    # the end of the episode (placed workers only).
    policy_lag: float | None = None

    @classmethod
    def concat(cls, parts: list[EpisodeStats], policy_lag: float | None) -> EpisodeStats:
        def joined(name: str) -> torch.Tensor:
            return torch.cat([getattr(part, name) for part in parts])

        return cls(
            joined("success"), joined("returns"), joined("lengths"), joined("intervened_steps"),
            joined("held_steps"), policy_lag,
        )  # fmt: skip


def run_episodes(
    env: VectorEnv,
    task_id: int,
    init_states: torch.Tensor,
    act: Callable[[torch.Tensor], torch.Tensor],
    on_step: Callable[[Batch], None],
    capture: RoundCapture | None = None,
) -> EpisodeStats:
    """Reset every copy to its init state, then step until each has ended one episode;
    `on_step` gets each step's transitions of the copies still in their episode;
    `capture` records a few copies' pictures for episode videos."""
    obs = env.reset(task_id, init_states)
    if capture is not None:
        capture.start()
    copies = env.num_envs
    # Kept beside the CPU envs, whatever device the actor is on.
    cpu = torch.device("cpu")
    running = torch.ones(copies, dtype=torch.bool, device=cpu)
    success = torch.zeros(copies, dtype=torch.bool, device=cpu)
    returns, lengths = torch.zeros(copies, device=cpu), torch.zeros(copies, device=cpu)
    intervened_steps, held_steps = torch.zeros(copies, device=cpu), torch.zeros(copies, device=cpu)
    while bool(running.any()):
        actions = act(obs)
        step = env.step(actions)
        if capture is not None:
            capture.step(step)
        rows = transition_batch(obs, actions, step)
        on_step({name: tensor[running] for name, tensor in rows.items()})
        returns += torch.where(running, step.reward, 0.0)
        lengths += running.float()
        intervened_steps += (running & rows["intervened"]).float()
        if step.held is not None:
            held_steps += (running & step.held).float()
        success |= running & step.success
        running &= ~step.done
        obs = step.obs
    return EpisodeStats(success, returns, lengths, intervened_steps, held_steps)
