"""What an RLPD run's actor achieves on its own, measured plainly: every env copy runs
one episode of each task from the task's first init states with deterministic actions,
no one intervening. A yardstick for tests, independent of trainer.evaluation."""

import torch

from trainer.envs.intervention import InterventionEnv
from trainer.runner.rlpd_runner import RLPDRunner


@torch.no_grad()
def success_alone(runner: RLPDRunner) -> float:
    env = runner.env.env if isinstance(runner.env, InterventionEnv) else runner.env
    successes = episodes = 0
    for task_id in runner.task_cursor.tasks:
        states = env.init_states(task_id)
        index = torch.arange(env.num_envs) % states.shape[0]
        obs = env.reset(task_id, states[index])
        running = torch.ones(env.num_envs, dtype=torch.bool)
        while bool(running.any()):
            step = env.step(runner.algorithm.learner.actor.act(obs, deterministic=True))
            successes += int((running & step.success).sum())
            running &= ~step.done
            obs = step.obs
        episodes += env.num_envs
    return successes / episodes
