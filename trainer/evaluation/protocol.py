"""The evaluation protocol: every task × every one of its fixed init states (LIBERO's 50),
deterministic actions (the plan's mean), the env's own settle steps and step limit, one
episode each; per task, per horizon of the run's pattern, and their averages. A policy
that acts one action at a time (RLPD's actor) is run as plans of horizon 1
(`OneActionPlans`).

Episodes run `num_envs` at a time on the env (split over `env.num_workers` processes
when the config asks for them); a batch that is not full repeats its last state and
ignores the extra slots, so every state counts exactly once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from trainer.envs.vector_env import VectorEnv
from trainer.models.plan_cache import PlanCache
from trainer.models.policy import GaussianChunkPolicy
from trainer.videos.capture import RoundCapture
from trainer.videos.eval_videos import EvalVideos


class OneActionPlans(nn.Module):
    """An actor that gives one action per observation (RLPD's squashed Gaussian), seen
    by the protocol as a policy whose plans are one action long; deterministic: its
    `act(obs, deterministic=True)`."""

    max_horizon = 1

    def __init__(self, actor: nn.Module, action_dim: int) -> None:
        super().__init__()
        self.actor, self.env_action_dim = actor, action_dim

    @torch.no_grad()
    def sample_plan(
        self, obs: torch.Tensor, horizons: torch.Tensor, deterministic: bool = True,
        steps: int | None = None, chunk: int = 1,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        action = self.actor.act(obs, deterministic=True)
        return action.unsqueeze(1), torch.zeros(obs.shape[0], 1, device=action.device)


@dataclass
class TaskResult:
    task_id: int
    name: str
    episodes: int = 0
    successes: int = 0
    per_horizon: dict[int, list[int]] = field(default_factory=dict)  # H -> [successes, episodes]

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


@dataclass
class EvalTable:
    env: str
    suite: str | None
    checkpoint: str
    iteration: int
    horizons: list[int]
    tasks: list[TaskResult]

    @property
    def average(self) -> float:
        """The suite average: the mean of the tasks' rates (each task counts once)."""
        return sum(t.rate for t in self.tasks) / len(self.tasks) if self.tasks else 0.0

    def horizon_average(self, horizon: int) -> float:
        rates = [_rate(t.per_horizon[horizon]) for t in self.tasks if horizon in t.per_horizon]
        return sum(rates) / len(rates) if rates else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "env": self.env,
            "suite": self.suite,
            "checkpoint": self.checkpoint,
            "iteration": self.iteration,
            "horizons": self.horizons,
            "average": self.average,
            "horizon_average": {str(h): self.horizon_average(h) for h in self.horizons},
            "tasks": [
                {
                    **{k: v for k, v in asdict(task).items() if k != "per_horizon"},
                    "rate": task.rate,
                    "per_horizon": {
                        str(h): {"successes": s, "episodes": n, "rate": _rate([s, n])}
                        for h, (s, n) in sorted(task.per_horizon.items())
                    },
                }
                for task in self.tasks
            ],
        }

    def to_markdown(self) -> str:
        several = len(self.horizons) > 1
        head = ["task", "name", "success", "episodes"] + [
            f"H={h}" for h in self.horizons if several
        ]
        lines = [
            f"# Evaluation of {self.checkpoint} (iteration {self.iteration})",
            "",
            f"{self.env}{f' / {self.suite}' if self.suite else ''}: every task × every fixed "
            "init state, deterministic actions.",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "|".join("---" for _ in head) + "|",
        ]
        for task in self.tasks:
            row = [str(task.task_id), task.name, f"{task.rate:.3f}", str(task.episodes)]
            if several:
                row += [f"{_rate(task.per_horizon.get(h, [0, 0])):.3f}" for h in self.horizons]
            lines.append("| " + " | ".join(row) + " |")
        average = ["**average**", "", f"**{self.average:.3f}**", ""]
        if several:
            average += [f"{self.horizon_average(h):.3f}" for h in self.horizons]
        lines.append("| " + " | ".join(average) + " |")
        return "\n".join(lines) + "\n"


def _rate(pair: list[int]) -> float:
    successes, episodes = pair
    return successes / episodes if episodes else 0.0


@torch.no_grad()
def evaluate(
    policy: GaussianChunkPolicy | OneActionPlans,
    env: VectorEnv,
    task_ids: list[int],
    horizons: list[int],
    chunk: int,
    states_per_task: int | None = None,
    on_task: Callable[[TaskResult], None] | None = None,
    videos: EvalVideos | None = None,
) -> list[TaskResult]:
    """Run the protocol; `states_per_task` caps the init states (None: all of them).
    `on_task` is called with each task's result as soon as it is complete; `videos`
    records the first episodes of each task and horizon."""
    policy.eval()
    steps = -(-env.max_episode_steps // chunk)
    results = []
    for task_id in task_ids:
        states = env.init_states(task_id)
        if states_per_task is not None:
            states = states[:states_per_task]
        result = TaskResult(task_id, env.task_name(task_id))
        for horizon in horizons:
            successes = 0
            for start in range(0, states.shape[0], env.num_envs):
                batch = states[start : start + env.num_envs]
                used = batch.shape[0]
                padded = torch.cat(
                    [batch, batch[-1:].expand(env.num_envs - used, *batch.shape[1:])]
                )
                capture = (videos.capture(task_id, result.name, horizon, start, used)
                           if videos is not None else None)  # fmt: skip
                success = _episodes(policy, env, task_id, padded, horizon, chunk, steps, capture)
                if capture is not None:
                    videos.finish(capture)
                successes += int(success[:used].sum())
            result.per_horizon[horizon] = [successes, int(states.shape[0])]
            result.successes += successes
            result.episodes += int(states.shape[0])
        results.append(result)
        if on_task is not None:
            on_task(result)
    return results


def _episodes(
    policy: GaussianChunkPolicy | OneActionPlans,
    env: VectorEnv,
    task_id: int,
    init_states: torch.Tensor,
    horizon: int,
    chunk: int,
    steps: int,
    capture: RoundCapture | None = None,
) -> torch.Tensor:
    """One episode per slot; whether each succeeded before its first end. The policy
    decides on its own device; the env steps on the CPU."""
    device = next(policy.parameters()).device
    obs = env.reset(task_id, init_states)
    if capture is not None:
        capture.start()
    horizons = torch.full((env.num_envs,), horizon, device="cpu")
    plans = PlanCache(horizons, chunk, policy.max_horizon, device)
    ended = torch.zeros(env.num_envs, dtype=torch.bool, device="cpu")
    success = torch.zeros(env.num_envs, dtype=torch.bool, device="cpu")
    for _ in range(steps):
        replan, replan_horizons, plan_steps = plans.replan_slots()
        if replan.numel():
            plan, log_probs = policy.sample_plan(
                obs.to(device).index_select(0, replan), replan_horizons, deterministic=True,
                steps=plan_steps, chunk=chunk,
            )  # fmt: skip
            plans.store(replan, plan, log_probs)
        actions = plans.next_chunk().actions[..., : policy.env_action_dim].cpu()
        step = env.step(actions)
        if capture is not None:
            capture.step(step)
        success |= step.success & ~ended
        ended |= step.done
        obs = step.obs
        if bool(ended.all()):
            break
    return success
