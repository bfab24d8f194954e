import logging
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trainer.algorithms import PPO, OnPolicySettings
from trainer.config import load_config
from trainer.data.rollout_storage import Trajectories
from trainer.data.samplers import InitStateSampler, round_init_state_indices
from trainer.envs import BuiltinReachEnv
from trainer.models import GaussianChunkPolicy, ValueCritic, assign_horizons, build_encoder
from trainer.runner.collection import collect_exact_batch, run_round
from trainer.runner.on_policy_runner import OnPolicyRunner

torch.set_num_threads(1)
REPO = Path(__file__).resolve().parents[3]


def _round(successes, first_group=0, group_size=2):
    batch = len(successes)
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
        valid=torch.ones(1, batch, dtype=torch.bool),
        advantage=step,
        returns=step,
        task_id=torch.zeros(batch, dtype=torch.long),
        init_state_index=torch.arange(batch),
        group_index=first_group + torch.arange(batch) // group_size,
        horizon=torch.full((batch,), 5),
        episode_success=torch.tensor(successes).bool(),
        episode_return=torch.zeros(batch),
        episode_length=torch.ones(batch, dtype=torch.long),
        loss_mask=torch.ones(batch),
    )


def _scripted(rounds):
    calls = iter(rounds)
    return lambda: next(calls)


def test_exactly_data_batch_size_trajectories_are_collected():
    # seed 001 scenario 3: 2 envs x group 2 per round, data_batch_size 4 ... and 6
    collected = collect_exact_batch(_scripted([_round([1, 0, 0, 1])]), 4, round_size=4)
    assert collected.batch.num_episodes == 4 and collected.rounds == 1
    rounds = [_round([1, 0, 0, 1], 0), _round([1, 1, 0, 0], 2)]
    collected = collect_exact_batch(_scripted(rounds), 6, round_size=4, group_size=2)
    assert collected.batch.num_episodes == 6 and collected.rounds == 2
    assert collected.batch.group_index.tolist() == [0, 0, 1, 1, 2, 2]


def test_the_filter_replaces_uninformative_groups_with_fresh_ones():
    rounds = [_round([1, 1, 1, 0], 0), _round([0, 0, 0, 1], 2), _round([1, 0, 1, 1], 4)]
    collected = collect_exact_batch(
        _scripted(rounds), 4, round_size=4, group_size=2, filter_groups=True, max_attempts=3
    )
    assert collected.batch.group_index.tolist() == [1, 1, 3, 3]
    assert collected.batch.loss_mask.tolist() == [1.0] * 4
    assert collected.rounds == 2 and collected.warning is None
    assert len(collected.episodes) == 2  # metrics see the dropped groups too


def test_the_filter_gives_up_after_its_attempts_with_a_mask_and_a_warning(caplog):
    every_rollout_succeeds = [_round([1, 1, 1, 1], 2 * i) for i in range(100)]
    with caplog.at_level(logging.WARNING):
        collected = collect_exact_batch(
            _scripted(every_rollout_succeeds),
            8,
            round_size=4,
            group_size=2,
            filter_groups=True,
            max_attempts=3,
        )
    assert collected.rounds == 6  # 2 rounds per pass x 3 attempts, not forever
    assert collected.batch.num_episodes == 8
    assert collected.batch.loss_mask.tolist() == [0.0] * 8
    assert collected.masked_trajectories == 8
    assert "only 0 of 8 trajectories" in caplog.text


def test_a_partly_filled_batch_is_completed_with_masked_groups():
    rounds = [_round([1, 0, 1, 1], 0), _round([1, 1, 0, 0], 2)]
    collected = collect_exact_batch(
        _scripted(rounds), 4, round_size=4, group_size=2, filter_groups=True, max_attempts=2
    )
    assert collected.batch.group_index.tolist() == [0, 0, 1, 1]
    assert collected.batch.loss_mask.tolist() == [1.0, 1.0, 0.0, 0.0]


def test_the_share_of_informative_groups_counts_every_group_of_every_round():
    rounds = [_round([1, 1, 1, 0], 0), _round([0, 0, 0, 1], 2), _round([1, 0, 1, 1], 4)]
    collected = collect_exact_batch(
        _scripted(rounds), 4, round_size=4, group_size=2, filter_groups=True, max_attempts=3
    )
    # Two rounds ran: groups [1, 1] and [0, 0] teach nothing, [1, 0] and [0, 1] do.
    assert (collected.informative_groups, collected.groups) == (2, 4)
    # Without the filter the share is measured all the same: the groups that train.
    unfiltered = collect_exact_batch(_scripted([_round([1, 1, 1, 0])]), 4, 4, group_size=2)
    assert (unfiltered.informative_groups, unfiltered.groups) == (1, 2)
    alone = collect_exact_batch(_scripted([_round([1, 0, 1, 0])]), 4, 4)
    assert (alone.informative_groups, alone.groups) == (0, 0)  # no groups to compare within


def test_an_iteration_reports_its_share_of_informative_groups(tmp_path):
    config = load_config(
        REPO / "examples/builtin_grpo.yaml",
        ["env.num_parallel_envs=4", "algorithm.group_size=4", "algorithm.data_batch_size=8",
         "algorithm.update_epochs=1", "runner.progress=false", "runner.torch_threads=1",
         f"runner.output_dir={tmp_path}"],
    )  # fmt: skip
    runner = OnPolicyRunner(config)
    rounds: list[float] = []
    collect = runner._collect_with_retries

    def counted(task_id):
        collected = collect(task_id)
        rounds.append(collected.informative_groups / collected.groups)
        return collected

    runner._collect_with_retries = counted
    metrics = runner.train_iteration()
    assert metrics["rollout/informative_group_share"] == pytest.approx(rounds[0])


def test_sizes_must_split_into_groups():
    with pytest.raises(ValueError, match="multiples of group_size"):
        collect_exact_batch(_scripted([]), 5, round_size=4, group_size=2)


def test_a_real_round_runs_one_episode_per_slot_from_the_sampled_states():
    torch.manual_seed(0)
    env = BuiltinReachEnv(num_envs=4, max_episode_steps=12)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 10)
    critic = ValueCritic(build_encoder("mlp", env.obs_shape, (16,)), max_horizon=10)
    algorithm = PPO(policy, critic, OnPolicySettings(), chunk=5)
    sampler = InitStateSampler({task: 50 for task in range(6)})
    indices = round_init_state_indices(sampler, 2, num_parallel_envs=2, group_size=2)
    trajectories = run_round(
        env, algorithm, 2, indices, assign_horizons([5, 10], 4), 3, group_size=2
    )
    assert trajectories.init_state_index.tolist() == [0, 0, 1, 1]
    assert trajectories.group_index.tolist() == [0, 0, 1, 1]
    assert trajectories.task_id.tolist() == [2, 2, 2, 2]
    assert trajectories.horizon.tolist() == [5, 10, 5, 10]
    # 12 actions: two full chunks and a 2-action chunk unless the slot succeeded
    ended = trajectories.done & trajectories.valid
    assert ended.sum(0).tolist() == [1, 1, 1, 1]
    failed = ~trajectories.episode_success
    assert (trajectories.episode_length[failed] == 12).all()


class NeverEnding(BuiltinReachEnv):
    """An env that ignores its step limit: its episodes outlive any round."""

    def step(self, actions):
        step = super().step(actions)
        keep_going = torch.zeros_like(step.done)
        return replace(step, truncated=keep_going, terminated=keep_going)


def test_a_round_never_leaves_an_episode_running_for_the_critic_to_guess():
    # PPO's returns bootstrap nothing at the end of a round (last values are 0): every
    # episode must have ended in it, which the step limit guarantees. An env that
    # breaks that is refused, not silently cut.
    env = NeverEnding(num_envs=2, max_episode_steps=10)
    policy = GaussianChunkPolicy(build_encoder("mlp", env.obs_shape, (16,)), 7, 7, 10)
    algorithm = PPO(policy, None, OnPolicySettings(), chunk=5)
    with pytest.raises(RuntimeError, match="2 episodes were still running after 2 steps"):
        run_round(env, algorithm, 0, [0, 1], assign_horizons([5], 2), 2)
