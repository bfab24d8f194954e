"""The rollout's graphed decisions, on the CPU: the fixed input and the copies out that a
GPU's replays use, with eager decisions in place of the replays (tests/gpu replays them
from CUDA graphs), and the plan cache's walk that a replay advances without its Python."""

import copy

import torch

from tests.device_guard import DeviceGuard
from trainer.algorithms import PPO, OnPolicySettings
from trainer.algorithms.decision_graph import GraphedDecisions
from trainer.envs import BuiltinReachEnv
from trainer.models import GaussianChunkPolicy, PlanCache, assign_horizons, build_encoder
from trainer.models.plan_cache import decide
from trainer.runner.collection import run_round

torch.set_num_threads(1)
FIELDS = ("obs", "plan_obs", "actions", "log_prob", "chunk_offset", "valid", "reward")


def _pair(pattern):
    env = BuiltinReachEnv(num_envs=6, max_episode_steps=40)
    torch.manual_seed(0)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 15)
    plain = PPO(policy, None, OnPolicySettings(), chunk=5)
    fixed = copy.deepcopy(plain)
    fixed.decision_graphs = GraphedDecisions(torch.device("cpu"), capture=False)
    return env, plain, fixed, assign_horizons(pattern, 6)


def _round(env, algorithm, horizons, seed):
    torch.manual_seed(seed)
    return run_round(env, algorithm, 0, list(range(6)), horizons, num_steps=8)


def test_decisions_on_the_fixed_input_are_the_plain_decisions():
    for pattern in ([5, 10, 15], [5]):
        env, plain, fixed, horizons = _pair(pattern)
        for seed in range(3):  # a round's phases first eager, then on the fixed input
            expected = _round(env, plain, horizons, seed)
            with DeviceGuard() as guard:  # the fixed input and the copies on the device
                got = _round(env, fixed, horizons, seed)
            assert guard.found == []
            for name in FIELDS:
                assert torch.equal(getattr(got, name), getattr(expected, name)), (pattern, name)
        phases = fixed.decision_graphs.phases[fixed.plan_cache]
        assert sorted(phases) == list(range(fixed.plan_cache.period))


def test_another_model_acting_makes_its_phase_eager_again():
    env, _, fixed, horizons = _pair([5, 10])
    _round(env, fixed, horizons, 0)
    graphs, cache = fixed.decision_graphs, fixed.plan_cache
    other = copy.deepcopy(fixed.acting_policy)
    fixed.acting_policy = other  # e.g. the full copy a sharded run acts with
    _round(env, fixed, horizons, 1)
    assert all(entry.policy is other for entry in graphs.phases[cache].values())


def test_advancing_the_walk_is_what_a_decision_does_to_it():
    policy = GaussianChunkPolicy(build_encoder("mlp", (4,), (8,)), 2, 2, 10)
    decided, advanced = (PlanCache(torch.tensor([5, 10, 5]), 5, 10) for _ in range(2))
    for _ in range(5):
        decide(policy, decided, torch.randn(3, 4), 5)
        advanced.advance()
        assert advanced.position() == decided.position()
        assert advanced.phase_key() == decided.phase_key()
    walked = decided.position()
    decide(policy, decided, torch.randn(3, 4), 5)
    decided.go_to(walked)  # as after a capture, which runs the Python of a decision
    assert decided.position() == advanced.position()
