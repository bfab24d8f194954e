from collections import Counter

import pytest
import torch

from trainer.algorithms import episode_counts, rates_from_counts, sum_counts
from trainer.data.rollout_storage import Trajectories


def _episodes(task, horizons, successes, lengths):
    batch = len(horizons)
    step = torch.zeros(1, batch)
    return Trajectories(
        obs=torch.zeros(1, batch, 2),
        plan_obs=torch.zeros(1, batch, 2),
        actions=torch.zeros(1, batch, 5, 7),
        chunk_offset=step.long(),
        plan_horizon=step.long(),
        log_prob=step,
        value=step,
        reward=step,
        env_reward=step,
        done=step.bool(),
        timeout=step.bool(),
        success=step.bool(),
        executed_actions=step.long(),
        intervened=torch.zeros_like(step, dtype=torch.bool),
        held=torch.zeros_like(step, dtype=torch.bool),
        valid=step.bool(),
        advantage=step,
        returns=step,
        task_id=torch.full((batch,), task),
        init_state_index=torch.arange(batch),
        group_index=torch.arange(batch),
        horizon=torch.tensor(horizons),
        episode_success=torch.tensor(successes).bool(),
        episode_return=torch.tensor(successes).float(),
        episode_length=torch.tensor(lengths),
        loss_mask=torch.ones(batch),
    )


def test_per_horizon_success_rates_come_from_counts_summed_over_ranks():
    rank0 = episode_counts(_episodes(0, [5, 10, 15, 5], [1, 1, 0, 1], [10, 20, 40, 10]))
    rank1 = episode_counts(_episodes(1, [5, 10], [0, 0], [40, 40]))
    assert rank0["plan_h5_success_count"] == 2 and rank0["plan_h5_total_count"] == 2
    metrics = rates_from_counts(sum_counts([rank0, rank1]))
    assert metrics["rollout/plan_success_rate_h5"] == pytest.approx(2 / 3)  # not mean(1, 0)
    assert metrics["rollout/plan_success_rate_h10"] == pytest.approx(1 / 2)
    assert metrics["rollout/plan_success_rate_h15"] == 0.0
    assert metrics["rollout/success_rate"] == pytest.approx(3 / 6)
    assert metrics["rollout/success_rate_task_0"] == pytest.approx(3 / 4)
    assert metrics["rollout/success_rate_task_1"] == 0.0
    assert metrics["rollout/episode_length"] == pytest.approx(160 / 6)
    assert metrics["rollout/episode_return"] == pytest.approx(0.5)


def test_no_episodes_give_no_rates():
    assert rates_from_counts(Counter()) == {}


def test_counts_are_reported_per_horizon_per_task_and_per_task_and_horizon():
    rank0 = episode_counts(_episodes(0, [5, 10, 15, 5], [1, 1, 0, 1], [10, 20, 40, 10]))
    rank1 = episode_counts(_episodes(1, [5, 10], [0, 0], [40, 40]))
    metrics = rates_from_counts(sum_counts([rank0, rank1]))
    counts = {k: v for k, v in metrics.items() if k.startswith("counts/")}
    assert counts == {
        "counts/episodes": 6, "counts/successes": 3,
        "counts/h5/episodes": 3, "counts/h5/successes": 2,
        "counts/h10/episodes": 2, "counts/h10/successes": 1,
        "counts/h15/episodes": 1, "counts/h15/successes": 0,
        "counts/task0/episodes": 4, "counts/task0/successes": 3,
        "counts/task1/episodes": 2, "counts/task1/successes": 0,
        "counts/task0/h5/episodes": 2, "counts/task0/h5/successes": 2,
        "counts/task0/h10/episodes": 1, "counts/task0/h10/successes": 1,
        "counts/task0/h15/episodes": 1, "counts/task0/h15/successes": 0,
        "counts/task1/h5/episodes": 1, "counts/task1/h5/successes": 0,
        "counts/task1/h10/episodes": 1, "counts/task1/h10/successes": 0,
    }  # fmt: skip
    # The rate keys stay as they were: no task × horizon rate sneaks in.
    assert not [k for k in metrics if k.startswith("rollout/") and "/h" in k[8:]]
