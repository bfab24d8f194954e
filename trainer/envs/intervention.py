"""Human interventions at the trainer level (seed 004): an env wrapper that asks an
external action source, at every step, whether it takes over each copy. Where it does,
its action replaces the policy's, and the step says which kind of step it was:

- `EnvStep.intervened`: an operator's input chose the action (a demonstration: it goes
  into both of RLPD's buffers);
- `EnvStep.held`: a safety rule held the copy still with a zero action (e-stop, a lost
  link, a takeover without a fresh command): recorded and charted, never a
  demonstration, as in HIL-SERL, where a step is a human's only while they give input.

Either way the policy did not choose it, so the row stays out of a policy-gradient
loss. The browser console plugs into the same `ActionSource` protocol; tests and demo
recording use the scripted operator below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import NamedTuple, Protocol

import torch

from trainer.envs.builtin_reach import NUM_MARKERS, TASK_NAMES
from trainer.envs.vector_env import EnvStep, VectorEnv


class SourceActions(NamedTuple):
    """What an action source does with each of `N` copies at one step."""

    actions: torch.Tensor  # [N, action_dim]; rows it does not take over are ignored
    takes_over: torch.Tensor  # [N] bool: its action replaces the policy's
    human: torch.Tensor  # [N] bool, within takes_over: an operator's input chose it


class ActionSource(Protocol):
    def act(self, obs: torch.Tensor, episode_step: torch.Tensor) -> SourceActions:
        """For each copy, the source's action and whether (and how) it takes over."""
        ...

    def episode_ended(self, done: torch.Tensor) -> None:
        """Copies whose episode ended in the last step (the next one starts afresh)."""
        ...

    # Optional: `after_step(policy_actions, step) -> EnvStep` sees what the policy wanted
    # and may end episodes (an operator's success or failure mark; trainer.envs.teleop).


class InterventionEnv(VectorEnv):
    """`env` with `source` taking over copies when it wants, one env step at a time."""

    def __init__(self, env: VectorEnv, source: ActionSource) -> None:
        self.env, self.source = env, source
        self.num_envs, self.num_tasks = env.num_envs, env.num_tasks
        self.obs_shape, self.action_dim = env.obs_shape, env.action_dim
        self.vision_language = env.vision_language
        self.max_episode_steps = env.max_episode_steps
        self.obs: torch.Tensor | None = None
        self.episode_step = torch.zeros(env.num_envs, dtype=torch.long)
        self.current_task_name = ""

    def init_states(self, task_id: int) -> torch.Tensor:
        return self.env.init_states(task_id)

    def task_name(self, task_id: int) -> str:
        return self.env.task_name(task_id)

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        self.obs = self.env.reset(task_id, init_states)
        self.current_task_name = self.env.task_name(task_id)
        self.episode_step.zero_()
        self.source.episode_ended(torch.ones(self.num_envs, dtype=torch.bool))
        return self.obs

    def step(self, actions: torch.Tensor) -> EnvStep:
        """One action per copy ([N, action_dim] or a chunk of one), or a chunk of C
        ([N, C, action_dim]) stepped one action at a time, the source asked before each:
        an operator acts per env step whatever the policy's chunk."""
        if self.obs is None:
            raise RuntimeError("reset the env before stepping it")
        if actions.dim() == 2:
            actions = actions[:, None]
        expected = (self.num_envs, self.action_dim)
        if actions.dim() != 3 or (actions.shape[0], actions.shape[2]) != expected:
            raise ValueError(
                f"actions must have shape ({self.num_envs}, {self.action_dim}) or "
                f"({self.num_envs}, chunk, {self.action_dim}), got {tuple(actions.shape)}"
            )
        if actions.shape[1] == 1:
            return self._step_one(actions[:, 0])
        return self._step_chunk(actions)

    def _step_one(self, actions: torch.Tensor) -> EnvStep:
        taken = self.source.act(self.obs, self.episode_step)
        applied = torch.where(taken.takes_over[:, None], taken.actions.to(actions.dtype), actions)
        human = taken.human & taken.takes_over
        step = replace(
            self.env.step(applied), applied_actions=applied, intervened=human,
            held=taken.takes_over & ~human,
        )  # fmt: skip
        after_step = getattr(self.source, "after_step", None)
        if after_step is not None:
            step = after_step(actions, step)
        self.obs = step.obs
        self.episode_step = torch.where(step.done, 0, self.episode_step + 1)
        if bool(step.done.any()):
            self.source.episode_ended(step.done)
        return step

    def _step_chunk(self, chunk: torch.Tensor) -> EnvStep:
        """The chunk's actions one env step each, combined into one step of the chunk:
        rewards summed, the executed actions counted, and `intervened` / `held` set
        where an operator chose (or a safety rule held) any of them, so the chunk's row
        weighs nothing in the policy-gradient terms. `applied_actions` is [N, C, A],
        with `human_actions` / `held_actions` flagging each executed step. A copy whose
        episode ends inside the chunk reports that end; the chunk's remaining actions
        step it into its next episode uncounted (a round runs one episode per copy)."""
        copies, length = chunk.shape[0], chunk.shape[1]
        running = torch.ones(copies, dtype=torch.bool, device="cpu")
        zeros = torch.zeros(copies, dtype=torch.bool, device="cpu")
        terminated, truncated, success = zeros.clone(), zeros.clone(), zeros.clone()
        reward = torch.zeros(copies, device="cpu")
        executed = torch.zeros(copies, dtype=torch.long, device="cpu")
        applied = chunk.clone()
        human_actions = torch.zeros(copies, length, dtype=torch.bool, device="cpu")
        held_actions = torch.zeros(copies, length, dtype=torch.bool, device="cpu")
        obs: torch.Tensor | None = None
        final: torch.Tensor | None = None
        for index in range(length):
            step = self._step_one(chunk[:, index])
            live = running.clone()
            reward += torch.where(live, step.reward, 0.0)
            executed += live.long() * step.executed_actions
            terminated |= live & step.terminated
            truncated |= live & step.truncated
            success |= live & step.success
            applied[:, index] = step.applied_actions
            human_actions[:, index] = live & step.intervened
            held_actions[:, index] = live & step.held
            # Each copy keeps the observation of its own last counted step: a copy that
            # ended keeps the first of its next episode, as a one-action step gives.
            obs = (
                step.obs.clone()
                if obs is None
                else torch.where(_rows(live, step.obs), step.obs, obs)
            )
            ended = live & step.done
            last = step.final_observation if step.final_observation is not None else step.obs
            final = last.clone() if final is None else torch.where(_rows(ended, last), last, final)
            running &= ~step.done
            if not bool(running.any()):
                applied, human_actions, held_actions = (
                    t[:, : index + 1] for t in (applied, human_actions, held_actions)
                )
                break
        assert obs is not None and final is not None
        # Rows of copies still running: their final observation is their observation.
        final = torch.where(_rows(running, obs), obs, final)
        return EnvStep(
            obs=obs, reward=reward, terminated=terminated, truncated=truncated,
            success=success, executed_actions=executed, final_observation=final,
            applied_actions=applied, intervened=human_actions.any(1),
            held=held_actions.any(1) & ~human_actions.any(1),
            human_actions=human_actions, held_actions=held_actions,
        )  # fmt: skip

    def restart_workers(self) -> list[str]:
        return self.env.restart_workers()

    def close(self) -> None:
        self.env.close()


class ScriptedReachOperator:
    """A test operator for the built-in env: it steers the effector straight at the
    goal with the gripper the task wants. It takes over a `share` of the episodes
    (drawn at each episode's start), for at most `max_steps` steps of each."""

    def __init__(self, num_envs: int, share: float = 1.0, max_steps: int | None = None,
                 seed: int = 0, speed: float = 1.0,
                 state: Callable[[], torch.Tensor] | None = None) -> None:  # fmt: skip
        """`state`: where to read the env's state observation when the observations it
        is given are something else (a VLA's packed images)."""
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"share: must be between 0 and 1, not {share}")
        self.share, self.max_steps, self.speed = share, max_steps, speed
        self.state = state
        self.generator = torch.Generator().manual_seed(seed)
        self.chosen = torch.zeros(num_envs, dtype=torch.bool)

    def episode_ended(self, done: torch.Tensor) -> None:
        draw = torch.rand(done.shape[0], generator=self.generator) < self.share
        self.chosen = torch.where(done, draw, self.chosen)

    def act(self, obs: torch.Tensor, episode_step: torch.Tensor) -> SourceActions:
        if self.state is not None:
            obs = self.state()
        to_goal = obs[:, 4:7]  # goal marker minus effector (BuiltinReachEnv._observe)
        task = obs[:, -len(TASK_NAMES) :].argmax(1)  # the task's one-hot comes last
        direction = to_goal / to_goal.norm(dim=1, keepdim=True).clamp_min(1e-6)
        actions = torch.zeros(obs.shape[0], 7)
        actions[:, :3] = direction * self.speed
        actions[:, 6] = torch.where(task >= NUM_MARKERS, 1.0, -1.0)
        active = self.chosen.clone()
        if self.max_steps is not None:
            active &= episode_step < self.max_steps
        return SourceActions(actions, active, active)


def _rows(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """`mask` [N] shaped to broadcast over the rows of `like` [N, ...]."""
    return mask.view(-1, *([1] * (like.dim() - 1)))
