"""PPO asks its critic for ``V(obs, H, offset)`` everywhere it values a state: the
round's rows (GAE), the value loss, and the time-out bootstrap, where the terminal state
stands one chunk further into its plan than the step that reached it."""

import pytest
import torch
from torch import nn

from trainer.algorithms import PPO, OnPolicySettings
from trainer.envs import BuiltinReachEnv
from trainer.models import GaussianChunkPolicy, assign_horizons, build_encoder

torch.set_num_threads(1)
GAMMA = 0.9


class PlanCritic(nn.Module):
    """V = 10·H + offset (plus a bias that trains); records the plan positions it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(()))
        self.seen: list[tuple[torch.Tensor, torch.Tensor]] = []

    def forward(self, obs, horizons, offsets):
        assert horizons.shape == offsets.shape == obs.shape[:1]
        self.seen.append((horizons.clone(), offsets.clone()))
        return 10.0 * horizons.float() + offsets.float() + self.bias


def _ppo(env: BuiltinReachEnv, steps: int) -> PPO:
    torch.manual_seed(0)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 10)
    settings = OnPolicySettings(gamma=GAMMA, update_epochs=1, num_minibatches=1)
    algorithm = PPO(policy, PlanCritic(), settings, chunk=5)
    algorithm.start_round(assign_horizons([5, 10], env.num_envs), num_steps=steps)
    return algorithm


def test_the_time_out_bootstrap_values_the_terminal_state_one_chunk_into_its_plan():
    env = BuiltinReachEnv(num_envs=2, max_episode_steps=5)  # one decision, then the limit
    algorithm = _ppo(env, steps=1)
    algorithm.act(env.reset(0, env.init_states(0)[:2]))
    step = env.step(torch.zeros(2, 5, 7))
    assert step.truncated.all() and not step.terminated.any()
    algorithm.process_env_step(step)
    # H=5 is used up after its chunk (next offset 0, a fresh plan); H=10 is at offset 5.
    expected = [GAMMA * (10 * 5 + 0), GAMMA * (10 * 10 + 5)]
    assert algorithm.storage._rows[0].number("reward").tolist() == pytest.approx(expected)


def test_the_rounds_values_and_the_value_loss_see_each_rows_plan_position():
    env = BuiltinReachEnv(num_envs=4, max_episode_steps=20)
    algorithm = _ppo(env, steps=4)
    obs = env.reset(1, env.init_states(1)[:4])
    for _ in range(4):
        step = env.step(algorithm.act(obs))
        algorithm.process_env_step(step)
        obs = step.obs
    batch = algorithm.finish_round(1, torch.arange(4), torch.arange(4))
    valid = batch.valid
    assert bool((batch.chunk_offset[valid] == 5).any())  # some rows are mid-plan
    expected = (10 * batch.plan_horizon + batch.chunk_offset).float() * valid
    assert torch.allclose(batch.value, expected)
    critic = algorithm.critic
    critic.seen.clear()
    algorithm.update(algorithm.compute_returns(batch))
    rows = {(h, o) for h, o in zip(batch.plan_horizon[valid].tolist(),
                                   batch.chunk_offset[valid].tolist(), strict=True)}  # fmt: skip
    seen = {
        (h, o)
        for horizons, offsets in critic.seen
        for h, o in zip(horizons.tolist(), offsets.tolist(), strict=True)
    }
    assert seen == rows and (10, 5) in seen
