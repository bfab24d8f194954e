import copy
from dataclasses import replace

import pytest
import torch

from trainer.algorithms import GRPO, PPO, RLOO, OnPolicySettings, informative_groups
from trainer.algorithms.metrics import episode_counts, rates_from_counts
from trainer.data.rollout_storage import TRAINING_KEYS
from trainer.envs import BuiltinReachEnv
from trainer.models import GaussianChunkPolicy, ValueCritic, assign_horizons, build_encoder
from trainer.runner.collection import run_round

torch.set_num_threads(1)


def _setup(cls, with_critic=True, num_envs=8, **settings):
    torch.manual_seed(0)
    env = BuiltinReachEnv(num_envs=num_envs, max_episode_steps=20)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 10)
    encoder = build_encoder("mlp", env.obs_shape, (16,))
    critic = ValueCritic(encoder, max_horizon=10) if with_critic else None
    algorithm = cls(
        policy,
        critic,
        OnPolicySettings(**settings),
        chunk=5,
        generator=torch.Generator().manual_seed(0),
    )
    batch = run_round(
        env,
        algorithm,
        0,
        list(range(num_envs)),
        assign_horizons([5, 10], num_envs),
        4,
        group_size=settings.get("group_size", 1),
    )
    return env, algorithm, algorithm.compute_returns(batch)


def _params(algorithm):
    return [p.detach().clone() for p in algorithm.policy.parameters()]


def test_minibatches_hold_only_per_row_training_tensors():
    _, _, batch = _setup(PPO)
    samples = batch.training_samples()
    assert set(samples) == set(TRAINING_KEYS)
    rows = int(batch.valid.sum())
    assert all(value.shape[0] == rows for value in samples.values())


def test_ppo_first_minibatch_has_ratio_one_and_the_hand_computed_loss():
    _, algorithm, batch = _setup(
        PPO, update_epochs=1, num_minibatches=1, normalize_advantages=False, entropy_coef=0.0
    )
    samples = batch.training_samples()
    stats = algorithm._minibatch_step(samples)
    # ratio == 1 before any step: approx KL 0, nothing clipped, loss = -mean(A)
    assert stats["losses/approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert stats["losses/clip_fraction"] == 0.0
    assert stats["losses/policy_loss"] == pytest.approx(
        -float(samples["advantage"].mean()), abs=1e-6
    )


@pytest.mark.parametrize("ratio", ["chunk", "geometric_mean"])
def test_the_clipped_ratio_is_the_chunks_or_its_geometric_mean_over_actions_and_dims(ratio):
    _, algorithm, batch = _setup(GRPO, group_size=2, ratio=ratio)
    samples = batch.training_samples()
    samples["log_prob"] = samples["log_prob"] - 0.7  # the chunk's 35 log-probs moved
    stats = algorithm._minibatch_step(samples)
    kl = torch.tensor(0.7).exp() - 1 - 0.7  # per chunk, as target_kl reads it in both
    assert stats["losses/approx_kl"] == pytest.approx(float(kl), rel=1e-4)
    # Outside the clip range as a chunk (ratio 2.01). The geometric mean over the 35
    # action dims (1.02) is clipped in log space by the chunk's range over 35: the same.
    assert stats["losses/clip_fraction"] == 1.0


def test_value_loss_is_clipped_around_the_rollout_value():
    _, algorithm, _ = _setup(PPO, value_clip=0.1)
    obs = torch.zeros(2, 19)
    plan = {"plan_horizon": torch.tensor([5, 10]), "chunk_offset": torch.tensor([0, 5])}
    with torch.no_grad():
        v = algorithm.critic(obs, plan["plan_horizon"], plan["chunk_offset"])
    mb = {"obs": obs, **plan, "value": v - 1.0, "returns": v - 1.0, "weight": torch.ones(2)}
    # unclipped error 1.0; clipped prediction v-0.9 has error 0.01; max -> 1.0; *0.5
    assert algorithm._value_loss(mb, mb["weight"].sum()).item() == pytest.approx(0.5, abs=1e-5)
    mb["returns"] = v + 1.0
    # unclipped error 1; clipped (v-0.9 vs v+1) error 1.9^2 = 3.61 -> 0.5 * 3.61
    assert algorithm._value_loss(mb, mb["weight"].sum()).item() == pytest.approx(
        0.5 * 3.61, abs=1e-4
    )


def test_kl_early_stop_halts_the_update_before_the_step():
    _, algorithm, batch = _setup(PPO, target_kl=1e-9, update_epochs=3)
    batch.log_prob += 0.5  # as if the policy had moved since the rollout
    before = _params(algorithm)
    metrics = algorithm.update(batch)
    assert metrics["losses/early_stopped"] == 1.0 and metrics["losses/updates"] == 0.0
    assert all(torch.equal(a, b) for a, b in zip(before, _params(algorithm), strict=True))


def test_ppo_update_reports_every_stable_metric_name():
    _, algorithm, batch = _setup(PPO)
    metrics = algorithm.update(batch)
    for name in (
        "losses/policy_loss",
        "losses/value_loss",
        "losses/entropy",
        "losses/approx_kl",
        "losses/clip_fraction",
        "losses/updates",
    ):
        assert name in metrics
    assert metrics["losses/updates"] == 16.0


def test_masked_trajectories_change_nothing():
    settings = dict(update_epochs=1, num_minibatches=1, group_size=2)
    _, algorithm, batch = _setup(GRPO, with_critic=False, **settings)
    batch.episode_success[:] = torch.tensor([1, 0, 1, 0, 1, 1, 0, 1]).bool()
    batch = algorithm.compute_returns(batch)
    subset_algorithm = copy.deepcopy(algorithm)
    mask = torch.tensor([1, 1, 0, 0, 1, 1, 0, 0]).float()
    algorithm.update(batch.with_loss_mask(mask))
    subset_algorithm.update(batch.select(mask.bool()))
    for a, b in zip(_params(algorithm), _params(subset_algorithm), strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    everything_masked = copy.deepcopy(subset_algorithm)
    before = _params(everything_masked)
    everything_masked.update(batch.with_loss_mask(torch.zeros(8)))
    assert all(torch.equal(a, b) for a, b in zip(before, _params(everything_masked), strict=True))


def test_grpo_and_rloo_give_every_step_its_trajectory_advantage():
    _, grpo, batch = _setup(GRPO, with_critic=False, group_size=4)
    batch.episode_success[:] = torch.tensor([1, 0, 0, 1, 0, 0, 0, 0]).bool()
    advantage = grpo.compute_returns(batch).advantage
    expected = torch.tensor([0.866025, -0.866025, -0.866025, 0.866025, 0, 0, 0, 0])
    assert torch.allclose(advantage[0], expected, atol=1e-5)
    assert torch.equal(advantage[~batch.valid], torch.zeros(int((~batch.valid).sum())))
    rloo = RLOO(grpo.policy, None, grpo.settings, chunk=5)
    assert torch.allclose(
        rloo.compute_returns(batch).advantage[0, :4],
        torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3]),
        atol=1e-6,
    )


@pytest.mark.parametrize("cls", [GRPO, RLOO])
def test_episode_aggregation_gives_each_episode_the_same_total_weight(cls):
    """Long failures and short successes: by rows, each decision weighs the same; by
    episodes, an episode's rows share its advantage, so each weighs the same in all."""
    _, by_rows, batch = _setup(cls, with_critic=False, group_size=4)
    batch.episode_success[:] = torch.tensor([1, 0, 0, 0, 0, 1, 0, 0]).bool()
    batch.valid[:] = True
    batch.valid[1:, 0] = batch.valid[2:, 5] = False  # the successes end early
    rows = batch.valid.float().sum(0)
    per_row = by_rows.compute_returns(batch).advantage[0]
    settings = replace(by_rows.settings, loss_aggregation="episodes")
    by_episodes = cls(by_rows.policy, None, settings, chunk=5)
    advantage = by_episodes.compute_returns(batch).advantage
    totals = advantage.sum(0)
    assert torch.allclose(totals, per_row * rows.mean(), atol=1e-6)
    assert torch.allclose(advantage[0], per_row * rows.mean() / rows, atol=1e-6)
    assert torch.equal(advantage[~batch.valid], torch.zeros(int((~batch.valid).sum())))
    # In a group, what the successes push up now balances what the failures push down.
    assert abs(float(totals[:4].sum())) < 1e-5
    assert float(by_rows.compute_returns(batch).advantage[:, :4].sum()) < -1.0


def test_plan_reward_tops_grpo_advantages_and_enters_the_last_ppo_reward():
    _, grpo, batch = _setup(
        GRPO, with_critic=False, group_size=2, use_plan_reward=True, plan_reward_coef=0.5, base_h=5
    )
    batch.episode_success[:] = torch.tensor([1, 0, 1, 1, 0, 0, 0, 1]).bool()
    # Horizons alternate 5, 10 (bonus 0.5, 1.0), added after the group's normalisation:
    # group 1 is +-0.7071 plus its success's 0.5; group 2, all successes, keeps its
    # bonuses (normalised over them, its H=5 success was pushed down to -0.7071).
    advantage = grpo.compute_returns(batch).advantage[0]
    assert advantage[0:4].tolist() == pytest.approx([1.2071, -0.7071, 0.5, 1.0], abs=1e-3)
    _, ppo, ppo_batch = _setup(PPO, use_plan_reward=True, plan_reward_coef=0.5, base_h=5)
    plain = ppo_batch.reward.clone()
    ppo_batch.episode_success[:] = torch.tensor([1, 1, 0, 0, 0, 0, 0, 0]).bool()
    scored = ppo.compute_returns(ppo_batch)
    last = ppo_batch.last_step_index()
    assert float(scored.reward[last[0], 0] - plain[last[0], 0]) == pytest.approx(0.5, abs=1e-6)
    assert float(scored.reward[last[1], 1] - plain[last[1], 1]) == pytest.approx(1.0, abs=1e-6)
    assert torch.equal(scored.reward[:, 2:], plain[:, 2:])


@pytest.mark.parametrize("cls", [GRPO, RLOO])
def test_group_methods_built_directly_leave_their_advantages_unnormalised(cls):
    # The config layer is not the only way in: settings built in code must give the
    # same update as an explicit normalize_advantages=False.
    results = {}
    for normalize in (None, False, True):
        _, algorithm, batch = _setup(cls, group_size=2, normalize_advantages=normalize)
        # Advantages far from mean 0 / std 1, so normalising them would change the step.
        spread = torch.linspace(0.5, 3.0, batch.advantage.shape[1])
        algorithm.update(replace(batch, advantage=spread * batch.valid.float()))
        results[normalize] = _params(algorithm)
    assert all(torch.equal(a, b) for a, b in zip(results[None], results[False], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(results[None], results[True], strict=True))


def test_ppo_normalises_advantages_over_the_policys_rows_only():
    # Five rows the policy chose and three a human chose (policy weight 0, advantage 5).
    # The human rows must not move the policy rows' statistics: mean 0, population std
    # sqrt(0.5) over [1, -1, .5, -.5, 0] alone, as rsl_rl and CleanRL normalise.
    _, algorithm, batch = _setup(PPO, update_epochs=1, num_minibatches=1)
    samples = {key: value[:8].clone() for key, value in batch.training_samples().items()}
    samples["advantage"] = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 5.0, 5.0, 5.0])
    samples["weight"] = torch.ones(8)
    samples["policy_weight"] = torch.tensor([1.0] * 5 + [0.0] * 3)
    algorithm.update_rows(samples)
    std = 0.5**0.5
    expected = [1 / std, -1 / std, 0.5 / std, -0.5 / std, 0.0]
    assert samples["advantage"][:5].tolist() == pytest.approx(expected, abs=1e-5)


@pytest.mark.parametrize(
    ("cls", "rescued_group"),
    [(GRPO, [1.5, -0.5, -0.5, -0.5]), (RLOO, [1.0, -1 / 3, -1 / 3, -1 / 3])],
)
def test_a_success_a_human_rescued_is_no_success_of_the_policy(cls, rescued_group):
    # Two groups of four from the same init state. Group 0: the policy succeeded alone
    # in episode 0, a human rescued episode 2. Group 1: only episode 5 succeeded, rescued.
    _, algorithm, batch = _setup(cls, group_size=4)
    batch.episode_success[:] = torch.tensor([1, 0, 1, 0, 0, 1, 0, 0]).bool()
    batch.intervened[:] = False
    batch.intervened[0, [2, 5]] = True
    advantage = algorithm.compute_returns(batch).advantage[0]
    # Scored as the policy did alone: [1, 0, 0, 0] and [0, 0, 0, 0].
    assert advantage[:4].tolist() == pytest.approx(rescued_group, abs=1e-4)
    assert advantage[4:].tolist() == [0.0] * 4
    # The group filter keeps group 0 and drops group 1, which differs only by the human.
    scores = algorithm.trajectory_scores(batch)
    assert informative_groups(scores, 4).tolist() == [True, False]
    # The run reports what the policy achieved on its own: 1 of the 6 unassisted.
    metrics = rates_from_counts(episode_counts(batch))
    assert metrics["rollout/success_rate"] == pytest.approx(3 / 8)
    assert metrics["rollout/unassisted_success_rate"] == pytest.approx(1 / 6)


@pytest.mark.parametrize("count", [0, 5, 23])
def test_minibatches_split_every_row_once_with_its_columns_intact(count):
    """Minibatches select packed columns (one selection per dtype): each row comes out
    once, every column with its own shape and dtype, also with no rows at all."""
    from trainer.data.rollout_storage import empty_training_samples, minibatches

    samples = empty_training_samples((3,), 2, 4)
    if count:
        samples = {
            "obs": torch.randn(count, 3), "plan_obs": torch.randn(count, 3),
            "actions": torch.randn(count, 2, 4), "chunk_offset": torch.arange(count),
            "plan_horizon": torch.arange(count) * 10, "log_prob": torch.randn(count),
            "value": torch.randn(count), "advantage": torch.arange(count).float(),
            "returns": torch.randn(count), "weight": torch.ones(count),
            "policy_weight": torch.ones(count),
        }  # fmt: skip
    parts = list(minibatches(samples, 4, torch.Generator().manual_seed(0), keep_empty=True))
    assert len(parts) == 4
    order = torch.cat([part["chunk_offset"] for part in parts])
    assert sorted(order.tolist()) == list(range(count))
    for part in parts:
        for name, value in part.items():
            assert value.dtype == samples[name].dtype
            assert value.shape[1:] == samples[name].shape[1:]
        rows = part["chunk_offset"]
        assert torch.equal(part["actions"], samples["actions"][rows])
        assert torch.equal(part["plan_horizon"], rows * 10)


def test_the_step_size_warms_up_over_its_first_updates_and_resumes_where_it_was():
    settings = {"learning_rate": 1e-3, "update_epochs": 1, "num_minibatches": 1}
    _, algorithm, batch = _setup(
        GRPO, with_critic=False, group_size=2, lr_warmup_updates=4, **settings
    )
    batch.episode_success[:] = torch.tensor([1, 0] * 4).bool()
    batch = algorithm.compute_returns(batch)
    seen = []
    for _ in range(5):
        algorithm.update(batch)
        seen.append(algorithm.optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    state = algorithm.state_dict()
    assert state["optimizer_steps"] == 5
    fresh = GRPO(copy.deepcopy(algorithm.policy), None, algorithm.settings, chunk=5)
    fresh.load_state_dict(state)
    assert fresh.optimizer_steps == 5
    del state["optimizer_steps"]  # a checkpoint from before the count: warmed up
    fresh.load_state_dict(state)
    assert fresh.optimizer_steps == 4


def test_the_critic_steps_at_its_own_rate_and_warms_up_with_the_policy():
    settings = {"update_epochs": 1, "num_minibatches": 1, "lr_warmup_updates": 2}
    _, algorithm, batch = _setup(PPO, learning_rate=1e-4, critic_learning_rate=1e-3, **settings)
    policy_group, critic_group = algorithm.optimizer.param_groups
    assert [id(p) for p in critic_group["params"]] == [id(p) for p in algorithm.critic.parameters()]
    seen = []
    for _ in range(3):
        algorithm.update(batch)
        seen += [policy_group["lr"], critic_group["lr"]]
    assert seen == pytest.approx([5e-5, 5e-4, 1e-4, 1e-3, 1e-4, 1e-3])
    # Unset, the critic steps at the policy's rate.
    _, same, _ = _setup(PPO, learning_rate=1e-4, **settings)
    assert [group["lr"] for group in same.optimizer.param_groups] == [1e-4, 1e-4]
