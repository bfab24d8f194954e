"""GAE, GRPO, RLOO and the plan reward against values computed by hand."""

import pytest
import torch

from trainer.algorithms import (
    compute_gae,
    group_normalized_advantages,
    informative_groups,
    leave_one_out_advantages,
    plan_reward_bonus,
)


def test_gae_matches_a_hand_computation():
    # gamma 0.9, lambda 0.8; the episode ends at t=2, so last_values is ignored.
    # d2 = 1 - 0.7 = 0.3                 A2 = 0.3
    # d1 = 0.9*0.7 - 0.6 = 0.03          A1 = 0.03 + 0.72*0.3 = 0.246
    # d0 = 0.9*0.6 - 0.5 = 0.04          A0 = 0.04 + 0.72*0.246 = 0.21712
    rewards = torch.tensor([[0.0], [0.0], [1.0]])
    values = torch.tensor([[0.5], [0.6], [0.7]])
    dones = torch.tensor([[False], [False], [True]])
    advantages, returns = compute_gae(rewards, values, dones, torch.tensor([10.0]), 0.9, 0.8)
    assert advantages[:, 0].tolist() == pytest.approx([0.21712, 0.246, 0.3])
    assert returns[:, 0].tolist() == pytest.approx([0.71712, 0.846, 1.0])


def test_gae_never_discounts_across_an_episode_end_and_bootstraps_running_ones():
    # column 0: episode ends at t=0, a new one runs at t=1 and continues (V(s_T)=0.5)
    # A1 = 0.9*0.5 - 0.3 = 0.15; A0 = 1 - 0.2 = 0.8 (done blocks the 0.15)
    rewards = torch.tensor([[1.0], [0.0]])
    values = torch.tensor([[0.2], [0.3]])
    dones = torch.tensor([[True], [False]])
    advantages, _ = compute_gae(rewards, values, dones, torch.tensor([0.5]), 0.9, 0.95)
    assert advantages[:, 0].tolist() == pytest.approx([0.8, 0.15])


def test_grpo_normalises_within_each_group():
    # group 1: mean 0.5, std (Bessel) sqrt(1/3) -> +-0.5/0.57735 = +-0.866025
    # group 2: all equal -> zero advantage, not NaN
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    advantages = group_normalized_advantages(scores, 4)
    expected = [0.866025, -0.866025, -0.866025, 0.866025, 0.0, 0.0, 0.0, 0.0]
    assert advantages.tolist() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize("size", [2, 3, 6, 8, 16])
@pytest.mark.parametrize("value", [1.2, 0.0, 1.0, 0.1, 3.7, -0.3, 1e6])
def test_grpo_gives_an_equal_group_exactly_zero_advantage(size, value):
    # In float32 the mean of six 1.2s is not 1.2; that rounding noise divided by its
    # own tiny std came out as +-0.1 before.
    scores = torch.cat([torch.full((size,), value), torch.tensor([0.0, 1.0] * (size // 2))])
    if size % 2:
        scores = torch.full((size,), value)
    advantages = group_normalized_advantages(scores, size)
    assert advantages.dtype == torch.float32
    assert advantages[:size].tolist() == [0.0] * size


def test_rloo_uses_a_leave_one_out_baseline():
    # A_i = s_i - mean(others): 1 - 1/3, 0 - 2/3, 0 - 2/3, 1 - 1/3 ; then 2 - 1, 1 - 2
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 1.0])
    assert leave_one_out_advantages(scores[:4], 4).tolist() == pytest.approx(
        [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    )
    assert leave_one_out_advantages(scores[4:], 2).tolist() == pytest.approx([1.0, -1.0])
    with pytest.raises(ValueError, match="group_size >= 2"):
        leave_one_out_advantages(scores, 1)
    with pytest.raises(ValueError, match="6 scores do not split into groups of 4"):
        group_normalized_advantages(scores, 4)


def test_plan_reward_goes_to_successful_trajectories_only_scaled_by_horizon():
    success = torch.tensor([True, False, True, True])
    horizon = torch.tensor([5, 10, 15, 10])
    # coef 0.1, base_h 5: 0.1*5/5, 0, 0.1*15/5, 0.1*10/5
    bonus = plan_reward_bonus(success, horizon, coef=0.1, base_h=5)
    assert bonus.tolist() == pytest.approx([0.1, 0.0, 0.3, 0.2])


def test_the_group_filter_keeps_only_mixed_groups():
    success = torch.tensor([1, 1, 0, 1, 0, 0, 1, 0, 0, 0]).float()
    assert informative_groups(success[:8], 2).tolist() == [False, True, False, True]
    with pytest.raises(ValueError, match="10 rollouts do not split into groups of 4"):
        informative_groups(success, 4)


def test_the_group_filter_compares_scores_whatever_they_are():
    # Groups whose scores differ are kept; equal scores carry nothing, whatever they are.
    # (GRPO gives it successes: the plan reward comes after the group's normalisation.)
    scores = torch.tensor([1.1, 1.2, 1.1, 1.1, 0.0, 0.0])
    assert informative_groups(scores, 2).tolist() == [True, False, False]
