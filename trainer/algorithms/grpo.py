"""GRPO and RLOO: critic-free, outcome-based advantages shared by every step of a
trajectory, relative to the other ``group_size`` rollouts from the same init state.

The plan reward is added after the group's normalisation, not to the score it
normalises: a group plans with one horizon (`assign_horizons`), so inside it the bonus
is the same for every success and would vanish in the normalisation; and were a group to
mix horizons, an all-success group normalised over its bonuses' tiny spread would push
its shorter-horizon successes down as hard as failures. Added after, it stays a bonus:
a success never gets less for it."""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer.algorithms.advantages import group_normalized_advantages, leave_one_out_advantages
from trainer.algorithms.on_policy import OnPolicyAlgorithm
from trainer.algorithms.plan_reward import plan_reward_bonus
from trainer.data.rollout_storage import Trajectories


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

    def plan_bonus(self, batch: Trajectories) -> torch.Tensor:
        """``[B]``: the plan reward of each trajectory (0 when it is off): the policy's
        own successes, by their horizon (an episode a human helped gets none)."""
        s = self.settings
        if not s.use_plan_reward:
            return torch.zeros(batch.num_episodes, device=batch.horizon.device)
        return plan_reward_bonus(batch.policy_success, batch.horizon, s.plan_reward_coef, s.base_h)

    def compute_returns(self, batch: Trajectories) -> Trajectories:
        # The group-relative part from the outcome alone (`trajectory_scores`, which the
        # group filter compares too), then the plan reward on top of it.
        per_episode = self.episode_advantages(self.trajectory_scores(batch))
        per_episode = per_episode + self.plan_bonus(batch)
        if self.settings.loss_aggregation == "episodes":
            per_episode = per_episode * episode_weights(batch.valid)
        advantage = per_episode[None, :] * batch.valid.float()
        return replace(batch, advantage=advantage, returns=torch.zeros_like(advantage))


class RLOO(GRPO):
    name = "rloo"

    def episode_advantages(self, scores: torch.Tensor) -> torch.Tensor:
        return leave_one_out_advantages(scores, self.settings.group_size)
