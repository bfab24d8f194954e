"""The scenarios of seed 001, literally."""

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.data.samplers import (
    CircularCursor,
    InitStateSampler,
    TaskCursor,
    round_init_state_indices,
    shard_tasks,
)
from trainer.runner.on_policy_runner import OnPolicyRunner

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_grpo.yaml"


def test_nine_tasks_over_two_ranks_are_sharded_round_robin():
    assert shard_tasks(list(range(9)), 2) == [[0, 2, 4, 6, 8], [1, 3, 5, 7]]


def test_a_rank_without_a_task_idles_as_the_seed_shows():
    # seed 001: one task over two ranks -> rank0: [9], rank1: []
    assert shard_tasks([9], 2) == [[9], []]
    idle = TaskCursor([])
    assert [idle.current() for _ in range(3)] == [None, None, None]


def test_each_iteration_works_on_one_task_chosen_by_the_cursor():
    seen = {0: [], 1: []}
    cursors = {rank: TaskCursor(shard_tasks(list(range(9)), 2)[rank]) for rank in (0, 1)}
    for _ in range(6):
        for rank, cursor in cursors.items():
            seen[rank].append(cursor.current())
            cursor.advance()
    assert seen == {0: [0, 2, 4, 6, 8, 0], 1: [1, 3, 5, 7, 1, 3]}


def test_init_states_come_from_a_circular_cursor():
    cursor = CircularCursor(10)
    assert [cursor.take(4) for _ in range(3)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


def test_ppo_slots_each_get_their_own_state_and_groups_share_one():
    sampler = InitStateSampler({0: 10, 1: 3})
    assert round_init_state_indices(sampler, 0, num_parallel_envs=4, group_size=1) == [0, 1, 2, 3]
    assert round_init_state_indices(sampler, 1, num_parallel_envs=2, group_size=3) == [
        0,
        0,
        0,
        1,
        1,
        1,
    ]
    # each task keeps its own cursor
    assert round_init_state_indices(sampler, 0, num_parallel_envs=2, group_size=1) == [4, 5]
    assert round_init_state_indices(sampler, 1, num_parallel_envs=2, group_size=1) == [2, 0]


def test_seed_001_scenario_2_per_rollout_states_from_the_circular_index():
    # 10 states, 2 envs x rloo_batch_size 2 = 4 states a round, three rounds.
    sampler = InitStateSampler({0: 10})
    rounds = [
        round_init_state_indices(sampler, 0, num_parallel_envs=2, group_size=2, mode="per_rollout")
        for _ in range(3)
    ]
    assert rounds == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]


def test_per_group_states_are_shared_within_a_group_and_advance_by_groups():
    sampler = InitStateSampler({0: 10})
    rounds = [
        round_init_state_indices(sampler, 0, num_parallel_envs=2, group_size=2, mode="per_group")
        for _ in range(3)
    ]
    assert rounds == [[0, 0, 1, 1], [2, 2, 3, 3], [4, 4, 5, 5]]
    with pytest.raises(ValueError, match="unknown init-state mode 'per_task'"):
        round_init_state_indices(sampler, 0, 2, 2, mode="per_task")


def test_the_config_chooses_the_mode_and_the_runner_follows_it(tmp_path):
    config = load_config(
        EXAMPLE, ["algorithm.init_states=per_rollout", "env.num_parallel_envs=2",
                  "algorithm.group_size=2", "algorithm.data_batch_size=4", "env.task_ids=[0]",
                  "env.init_states_per_task=10", "runner.iterations=3"],
    )  # fmt: skip
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    starts = [runner._next_round(0).init_state_index.tolist() for _ in range(3)]
    assert starts == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0, 1]]
    with pytest.raises(ConfigError, match="algorithm.init_states"):
        load_config(EXAMPLE, ["algorithm.init_states=sometimes"])


def test_sampler_positions_survive_a_checkpoint():
    sampler = InitStateSampler({0: 10, 1: 3})
    sampler.take(0, 7)
    restored = InitStateSampler({0: 10, 1: 3})
    restored.load_state_dict({str(k): v for k, v in sampler.state_dict().items()})
    assert restored.take(0, 4) == sampler.take(0, 4) == [7, 8, 9, 0]


@given(
    task_ids=st.lists(st.integers(0, 500), unique=True, min_size=1, max_size=40),
    world_size=st.integers(1, 8),
)
def test_sharding_partitions_the_tasks_evenly(task_ids, world_size):
    shards = shard_tasks(task_ids, world_size)
    assert sorted(t for shard in shards for t in shard) == sorted(task_ids)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    for rank, shard in enumerate(shards):
        assert shard == task_ids[rank::world_size]


@given(size=st.integers(1, 60), takes=st.lists(st.integers(0, 70), max_size=8))
def test_the_circular_cursor_hands_out_every_state_in_turn(size, takes):
    cursor = CircularCursor(size)
    handed = [index for count in takes for index in cursor.take(count)]
    assert handed == [k % size for k in range(sum(takes))]
