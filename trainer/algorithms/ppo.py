"""PPO: GAE advantages from a learned critic, clipped objective, value loss, entropy
bonus and KL early stop (the update itself is in ``on_policy``)."""

from __future__ import annotations

from dataclasses import replace

import torch

from trainer.algorithms.advantages import compute_gae
from trainer.algorithms.on_policy import OnPolicyAlgorithm
from trainer.algorithms.plan_reward import plan_reward_bonus
from trainer.data.rollout_storage import Trajectories


class PPO(OnPolicyAlgorithm):
    name = "ppo"

    def compute_returns(self, batch: Trajectories) -> Trajectories:
        s = self.settings
        rewards = batch.reward.clone()
        if s.use_plan_reward:
            # Scored at the trajectory's last decision, where its success is known;
            # a horizon earns no bonus for a success a human made.
            bonus = plan_reward_bonus(
                batch.policy_success, batch.horizon, s.plan_reward_coef, s.base_h
            )
            last = batch.last_step_index()
            rewards[last, torch.arange(batch.num_episodes, device=rewards.device)] += bonus
        # Every episode ends inside the batch (the time limit bounds T), so nothing
        # is bootstrapped past the last row.
        last_values = torch.zeros(batch.num_episodes, device=rewards.device)
        advantage, returns = compute_gae(
            rewards, batch.value, batch.done, last_values, s.gamma, s.gae_lambda
        )
        valid = batch.valid.float()
        return replace(batch, reward=rewards, advantage=advantage * valid, returns=returns * valid)
