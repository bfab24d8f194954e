"""The time-out bootstrap of seed 002 against rsl_rl's V(s_t) variant."""

import pytest
import torch
from torch import nn

from trainer.algorithms import PPO, OnPolicySettings, bootstrap_timeouts
from trainer.envs import BuiltinReachEnv, EnvStep
from trainer.models import GaussianChunkPolicy, assign_horizons, build_encoder

torch.set_num_threads(1)
GAMMA = 0.9


class CountingCritic(nn.Module):
    """V(s) = sum of the first three features (the effector position), whatever the
    plan (tests/trainer/algorithms/test_plan_aware_values.py covers that); counts calls."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def forward(self, obs, horizons, offsets):
        self.calls.append(obs.shape[0])
        return obs[:, :3].sum(1)


def rsl_rl_bootstrap(rewards, timeouts, values_t, gamma):
    """What rsl_rl / instinct_rl / HIMLoco do: bootstrap from V(s_t)."""
    return rewards + gamma * values_t * timeouts


def test_bootstrap_uses_the_true_final_observation_for_timed_out_rows_in_one_batch():
    critic = CountingCritic()
    rewards = torch.tensor([0.0, 1.0, 0.0, 0.0])
    timeouts = torch.tensor([True, False, False, True])
    final_obs = torch.tensor([[1.0, 1.0, 1.0], [5.0, 0, 0], [7.0, 0, 0], [0.5, 0.5, 0.0]])
    next_obs = torch.zeros(4, 3)  # already reset
    plan = {
        "horizons": torch.full((4,), 5),
        "offsets": torch.zeros(4, dtype=torch.long),
        "chunk": 5,
    }
    out = bootstrap_timeouts(rewards, timeouts, final_obs, next_obs, critic, GAMMA, **plan)
    assert out.tolist() == pytest.approx([0.9 * 3.0, 1.0, 0.0, 0.9 * 1.0])
    assert critic.calls == [2]  # one batched call over the two timed-out rows only
    assert rewards.tolist() == [0.0, 1.0, 0.0, 0.0]  # input left untouched
    # without a final observation it falls back to the next observation
    fallback = bootstrap_timeouts(rewards, timeouts, None, final_obs, critic, GAMMA, **plan)
    assert torch.equal(fallback, out)
    nothing = torch.zeros(4, dtype=torch.bool)
    unchanged = bootstrap_timeouts(rewards, nothing, None, next_obs, critic, GAMMA, **plan)
    assert torch.equal(unchanged, rewards)


def _ppo(env):
    # Seeded: whether a random policy's copy reaches its goal before the time limit must
    # not depend on which tests ran before.
    torch.manual_seed(0)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 5)
    algorithm = PPO(policy, CountingCritic(), OnPolicySettings(gamma=GAMMA), chunk=5)
    algorithm.start_round(assign_horizons([5], env.num_envs), num_steps=2)
    return algorithm


def test_a_time_out_differs_from_the_rsl_rl_bootstrap_when_the_last_action_moved():
    env = BuiltinReachEnv(num_envs=2, max_episode_steps=5)
    algorithm = _ppo(env)
    obs = env.reset(0, env.init_states(0)[:2])
    algorithm.act(obs)
    moving = torch.zeros(2, 5, 7)
    moving[:, :, :3] = 0.5
    step = env.step(moving)
    assert step.truncated.all()
    algorithm.process_env_step(step)
    stored = algorithm.storage._rows[0]
    ours = GAMMA * step.final_observation[:, :3].sum(1)
    theirs = rsl_rl_bootstrap(torch.zeros(2), torch.ones(2), obs[:, :3].sum(1), GAMMA)
    from_reset_obs = GAMMA * step.obs[:, :3].sum(1)
    assert stored.number("reward").tolist() == pytest.approx(ours.tolist())
    assert stored.number("env_reward").tolist() == [0.0, 0.0]
    assert (stored.number("reward") - theirs).abs().min() > 0.5
    assert (stored.number("reward") - from_reset_obs).abs().min() > 0.5


def test_both_bootstraps_agree_when_the_final_state_is_the_state_before_the_last_action():
    env = BuiltinReachEnv(num_envs=2, max_episode_steps=5)
    algorithm = _ppo(env)
    obs = env.reset(3, env.init_states(3)[:2])
    algorithm.act(obs)
    step = env.step(torch.zeros(2, 5, 7))  # standing still: s_terminal == s_t
    algorithm.process_env_step(step)
    stored = algorithm.storage._rows[0]
    theirs = rsl_rl_bootstrap(torch.zeros(2), torch.ones(2), obs[:, :3].sum(1), GAMMA)
    assert stored.number("reward").tolist() == pytest.approx(theirs.tolist())


def test_success_is_terminal_and_never_bootstrapped():
    env = BuiltinReachEnv(num_envs=1, max_episode_steps=5)
    algorithm = _ppo(env)
    algorithm.act(env.reset(0, env.init_states(0)[:1]))
    step = EnvStep(
        obs=torch.zeros(1, 19),
        reward=torch.ones(1),
        terminated=torch.ones(1, dtype=torch.bool),
        truncated=torch.ones(1, dtype=torch.bool),
        success=torch.ones(1, dtype=torch.bool),
        executed_actions=torch.tensor([5]),
        final_observation=torch.ones(1, 19),
    )
    algorithm.process_env_step(step)
    assert algorithm.storage._rows[0].number("reward").tolist() == [1.0]
    assert algorithm.storage._rows[0].number("timeout").tolist() == [0.0]


def _two_steps(env, algorithm):
    algorithm.start_round(assign_horizons([5], env.num_envs), num_steps=2)
    obs = env.reset(0, env.init_states(0)[: env.num_envs])
    for _ in range(2):
        step = env.step(algorithm.act(obs))
        algorithm.process_env_step(step)
        obs = step.obs


def test_the_round_is_valued_in_one_batched_critic_call_after_it_ends():
    env = BuiltinReachEnv(num_envs=3, max_episode_steps=10)
    algorithm = _ppo(env)
    _two_steps(env, algorithm)
    critic = algorithm.critic
    assert critic.calls == [3]  # the time-out bootstrap at the time limit, nothing per step
    critic.calls.clear()
    batch = algorithm.finish_round(0, torch.arange(3), torch.arange(3))
    assert critic.calls == [int(batch.valid.sum())]
    assert torch.allclose(batch.value, batch.obs[..., :3].sum(-1) * batch.valid)


def test_a_large_round_is_valued_in_bounded_batches(monkeypatch):
    from trainer.algorithms import on_policy

    monkeypatch.setattr(on_policy, "_CRITIC_BATCH_ELEMENTS", 19 * 4)  # 4 rows per call
    env = BuiltinReachEnv(num_envs=3, max_episode_steps=10)
    algorithm = _ppo(env)
    _two_steps(env, algorithm)
    algorithm.critic.calls.clear()
    batch = algorithm.finish_round(0, torch.arange(3), torch.arange(3))
    valid = int(batch.valid.sum())
    assert algorithm.critic.calls == [4] * (valid // 4) + ([valid % 4] if valid % 4 else [])
    assert torch.allclose(batch.value, batch.obs[..., :3].sum(-1) * batch.valid)
