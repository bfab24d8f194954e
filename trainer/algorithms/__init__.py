"""On-policy algorithms (PPO, GRPO, RLOO) and their building blocks."""

from trainer.algorithms.advantages import (
    compute_gae,
    group_normalized_advantages,
    leave_one_out_advantages,
)
from trainer.algorithms.behaviour_cloning import BehaviourCloning
from trainer.algorithms.bootstrap import bootstrap_timeouts
from trainer.algorithms.group_filter import informative_groups
from trainer.algorithms.grpo import GRPO, RLOO
from trainer.algorithms.metrics import episode_counts, rates_from_counts, sum_counts
from trainer.algorithms.on_policy import OnPolicyAlgorithm, OnPolicySettings
from trainer.algorithms.plan_reward import plan_reward_bonus
from trainer.algorithms.ppo import PPO

ALGORITHMS: dict[str, type[OnPolicyAlgorithm]] = {
    "ppo": PPO,
    "grpo": GRPO,
    "rloo": RLOO,
    "bc": BehaviourCloning,
}

__all__ = [
    "ALGORITHMS",
    "BehaviourCloning",
    "GRPO",
    "PPO",
    "RLOO",
    "OnPolicyAlgorithm",
    "OnPolicySettings",
    "bootstrap_timeouts",
    "compute_gae",
    "episode_counts",
    "group_normalized_advantages",
    "informative_groups",
    "leave_one_out_advantages",
    "plan_reward_bonus",
    "rates_from_counts",
    "sum_counts",
]
