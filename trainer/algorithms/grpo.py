"""GRPO and RLOO: critic-free, outcome-based advantages shared by every step of a
trajectory, relative to the other ``group_size`` rollouts from the same init state."""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer.algorithms.advantages import group_normalized_advantages, leave_one_out_advantages
from trainer.algorithms.on_policy import OnPolicyAlgorithm
from trainer.algorithms.plan_reward import plan_reward_bonus
from trainer.data.rollout_storage import Trajectories


def trajectory_scores(
    batch: Trajectories, settings_use_plan_reward: bool, coef: float, base_h: float
) -> torch.Tensor:
    """Outcome score per trajectory: 1 for a success of the policy's own (an episode a
    human helped scores 0), plus the plan reward if enabled."""
    success = batch.policy_success
    scores = success.float()
    if settings_use_plan_reward:
        scores = scores + plan_reward_bonus(success, batch.horizon, coef, base_h)
    return scores


def episode_weights(valid: torch.Tensor) -> torch.Tensor:
    """``[B]``: what scales each episode's advantage so that its decisions ``valid [T,
    B]`` weigh, together, as much as another episode's in a mean over rows: the mean
    decisions per episode over the episode's own. The clipped surrogate is linear in a
    positive scale of the advantage, so this is the per-episode mean of the loss."""
    decisions = valid.float().sum(0).clamp(min=1.0)
    return decisions.mean() / decisions


class GRPO(OnPolicyAlgorithm):
    name = "grpo"
    normalizes_advantages = False  # group-relative already

    def episode_advantages(self, scores: torch.Tensor) -> torch.Tensor:
        return group_normalized_advantages(scores, self.settings.group_size)

    def trajectory_scores(self, batch: Trajectories) -> torch.Tensor:
        s = self.settings
        return trajectory_scores(batch, s.use_plan_reward, s.plan_reward_coef, s.base_h)

    def compute_returns(self, batch: Trajectories) -> Trajectories:
        per_episode = self.episode_advantages(self.trajectory_scores(batch))
        if self.settings.loss_aggregation == "episodes":
            per_episode = per_episode * episode_weights(batch.valid)
        advantage = per_episode[None, :] * batch.valid.float()
        return replace(batch, advantage=advantage, returns=torch.zeros_like(advantage))


class RLOO(GRPO):
    name = "rloo"

    def episode_advantages(self, scores: torch.Tensor) -> torch.Tensor:
        return leave_one_out_advantages(scores, self.settings.group_size)
