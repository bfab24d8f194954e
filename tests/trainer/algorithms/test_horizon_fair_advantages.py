"""Horizon-fair GRPO/RLOO: each group plans with one horizon (groups take the pattern's
horizons in turn), and the plan reward is added after the group normalisation, so a
success is never pushed down by another rollout's longer horizon."""

from pathlib import Path

import pytest
import torch

from trainer.algorithms import GRPO, RLOO, OnPolicySettings, informative_groups
from trainer.config import load_config
from trainer.data.rollout_storage import Trajectories
from trainer.models import GaussianChunkPolicy, assign_horizons, build_encoder
from trainer.runner.on_policy_runner import OnPolicyRunner

torch.set_num_threads(1)
EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_grpo.yaml"
COEF, BASE_H = 0.1, 5.0


def _episodes(horizons: list[int], successes: list[int]) -> Trajectories:
    """One-step episodes, consecutive ones in a group."""
    batch = len(horizons)
    step = torch.zeros(1, batch)
    return Trajectories(
        obs=torch.zeros(1, batch, 19), plan_obs=torch.zeros(1, batch, 19),
        actions=torch.zeros(1, batch, 5, 7), chunk_offset=step.long(),
        plan_horizon=torch.tensor(horizons)[None, :], log_prob=step, value=step,
        reward=step, env_reward=step, done=torch.ones_like(step, dtype=torch.bool),
        timeout=step.bool(), success=torch.tensor(successes).bool()[None, :],
        executed_actions=step.long(), intervened=step.bool(), held=step.bool(),
        valid=torch.ones_like(step, dtype=torch.bool), advantage=step, returns=step,
        task_id=torch.zeros(batch, dtype=torch.long), init_state_index=torch.zeros(batch),
        group_index=torch.arange(batch), horizon=torch.tensor(horizons),
        episode_success=torch.tensor(successes).bool(),
        episode_return=torch.tensor(successes).float(),
        episode_length=torch.full((batch,), 5), loss_mask=torch.ones(batch),
    )  # fmt: skip


def _algorithm(kind: type[GRPO], group_size: int) -> GRPO:
    policy = GaussianChunkPolicy(build_encoder("mlp", (19,), (8,)), 7, 7, 15)
    settings = OnPolicySettings(
        group_size=group_size, use_plan_reward=True, plan_reward_coef=COEF, base_h=BASE_H,
        normalize_advantages=False,
    )  # fmt: skip
    return kind(policy, None, settings, chunk=5)


@pytest.mark.parametrize("kind", [GRPO, RLOO], ids=["grpo", "rloo"])
def test_an_all_success_group_of_mixed_horizons_pushes_no_success_down(kind):
    # Eight successes, H=5 and H=10 alternating, score 1.1 and 1.2 with the plan reward:
    # normalised over their tiny std those were -0.935 and +0.935, a successful H=5
    # rollout pushed down as hard as a failure would be.
    horizons = [5, 10] * 4
    algorithm = _algorithm(kind, group_size=8)
    batch = algorithm.compute_returns(_episodes(horizons, [1] * 8))
    advantage = batch.advantage[0]
    assert bool((advantage > 0).all()), advantage.tolist()
    # The group's outcomes are all equal: what remains is each success's own bonus.
    assert advantage.tolist() == pytest.approx([COEF * h / BASE_H for h in horizons])
    # Nothing in it is relative to the group: the filter sets it aside.
    assert informative_groups(algorithm.trajectory_scores(batch), 8).tolist() == [False]


@pytest.mark.parametrize("kind", [GRPO, RLOO], ids=["grpo", "rloo"])
def test_the_plan_reward_stays_a_bonus_on_top_of_the_group_relative_advantage(kind):
    # One group of H=10: two successes, two failures. Inside the group the bonus is the
    # same for every success, so added before the normalisation it vanished in it.
    algorithm = _algorithm(kind, group_size=4)
    batch = algorithm.compute_returns(_episodes([10] * 4, [1, 0, 1, 0]))
    without = _algorithm(kind, group_size=4)
    without.settings.use_plan_reward = False
    plain = without.compute_returns(_episodes([10] * 4, [1, 0, 1, 0])).advantage[0]
    bonus = torch.tensor([COEF * 10 / BASE_H, 0.0, COEF * 10 / BASE_H, 0.0])
    assert batch.advantage[0].tolist() == pytest.approx((plain + bonus).tolist())
    assert bool((batch.advantage[0][[0, 2]] > 0).all())


def test_groups_of_a_round_take_the_patterns_horizons_in_turn():
    # Group g plans with pattern[g % len(pattern)], counted over the run's groups, so a
    # round of fewer groups than horizons still leaves none of them out.
    assert assign_horizons([5, 10, 15], 8, group_size=2).tolist() == [
        5, 5, 10, 10, 15, 15, 5, 5,
    ]  # fmt: skip
    assert assign_horizons([5, 10, 15], 4, group_size=2, first_group=2).tolist() == [
        15, 15, 5, 5,
    ]  # fmt: skip
    # Rollouts that are groups of one (PPO) keep the slot-by-slot pattern.
    assert assign_horizons([5, 10, 15], 4).tolist() == [5, 10, 15, 5]


def test_every_group_of_an_iteration_has_one_horizon_and_every_horizon_is_used(tmp_path):
    # Two groups a round and three horizons: three rounds make the iteration's batch.
    config = load_config(
        EXAMPLE,
        [f"runner.output_dir={tmp_path}", "runner.progress=false", "runner.iterations=1",
         "env.num_parallel_envs=2", "algorithm.group_size=2", "algorithm.data_batch_size=12",
         "env.max_episode_steps=10", "algorithm.reward_filter.enabled=false",
         "rollout.action_horizons_pattern=[5,10,15]"],
    )  # fmt: skip
    runner = OnPolicyRunner(config)
    batches = []
    compute_returns = runner.algorithm.compute_returns

    def keep(batch):
        batches.append(batch)
        return compute_returns(batch)

    runner.algorithm.compute_returns = keep
    (metrics,) = runner.learn()
    (batch,) = batches
    groups = batch.group_index.tolist()
    per_group: dict[int, set[int]] = {}
    for group, horizon in zip(groups, batch.horizon.tolist(), strict=True):
        per_group.setdefault(group, set()).add(horizon)
    assert len(per_group) == 6 and all(len(h) == 1 for h in per_group.values()), per_group
    assert sorted(h for (h,) in per_group.values()) == [5, 5, 10, 10, 15, 15]
    # The plans themselves ran with the group's horizon, and the per-horizon rates stay.
    assert bool((batch.plan_horizon[batch.valid] > 0).all())
    assert torch.equal(
        batch.plan_horizon[batch.valid], batch.horizon.expand_as(batch.valid)[batch.valid]
    )
    for horizon in (5, 10, 15):
        assert f"rollout/plan_success_rate_h{horizon}" in metrics
