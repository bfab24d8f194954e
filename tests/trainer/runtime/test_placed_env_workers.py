"""Env workers as placed Ray actors: the plan's `env` processes split over the actor
ranks, each stepping a shard of its rank's copies on the node the plan names; a worker
killed mid-run is restarted on its placement and the iteration redone."""

import os
import signal
from pathlib import Path

import pytest

from tests.ray_cluster import labelled_ray_cluster
from trainer.cluster import cluster_from_dict, resolve_placement
from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.runtime.distributed_run import distributed_plan, train_distributed
from trainer.runtime.env_shards import assign_env_shards

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_ppo.yaml"
SMALL = [
    "env.num_parallel_envs=4", "algorithm.data_batch_size=8", "algorithm.num_minibatches=2",
    "algorithm.update_epochs=2", "runner.progress=false", "runner.torch_threads=1",
    "env.task_ids=[0,1]",
]  # fmt: skip


def env_processes(placement: str, nodes: int = 2):
    plan = resolve_placement(cluster_from_dict({"num_nodes": nodes}), {"env": placement})
    return plan.components["env"]


def test_env_workers_go_to_ranks_in_blocks_and_split_their_copies():
    shards = assign_env_shards(env_processes("0-2:0-5", nodes=3), world_size=4, copies_per_rank=5)
    assert [[s.process.process_rank for s in block] for block in shards] == [
        [0, 1], [2, 3], [4], [5],
    ]  # fmt: skip
    assert [[s.num_envs for s in block] for block in shards] == [[3, 2], [3, 2], [5], [5]]
    assert [[s.process.node_rank for s in block] for block in shards] == [
        [0, 0], [1, 1], [2], [2],
    ]  # fmt: skip
    assert assign_env_shards([], world_size=3, copies_per_rank=8) == [[], [], []]


def test_too_few_or_too_many_env_workers_are_config_errors():
    with pytest.raises(ConfigError, match="1 env process\\(es\\) for 2 actor ranks"):
        assign_env_shards(env_processes("0"), world_size=2, copies_per_rank=8)
    with pytest.raises(ConfigError, match="a worker would have none"):
        assign_env_shards(env_processes("0-1:0-3"), world_size=1, copies_per_rank=3)


def test_a_config_whose_env_workers_do_not_fit_its_ranks_is_refused_when_loaded():
    placed = "cluster={num_nodes: 2, component_placement: {actor: '0-1', env: '0'}}"
    with pytest.raises(ConfigError, match="cluster.component_placement.env: 1 env process"):
        load_config(EXAMPLE, [*SMALL, placed])


def test_one_rank_with_env_workers_is_a_distributed_run_without_it_is_not():
    placed = ["cluster={num_nodes: 2, component_placement: {actor: '0', env: '0-1'}}"]
    assert distributed_plan(load_config(EXAMPLE, [*SMALL, *placed])) is not None
    alone = ["cluster={num_nodes: 2, component_placement: {actor: '0'}}"]
    assert distributed_plan(load_config(EXAMPLE, [*SMALL, *alone])) is None


@pytest.fixture(scope="module")
def two_nodes():
    with labelled_ray_cluster([{"num_cpus": 1}, {"num_cpus": 1}]):
        yield


@pytest.mark.timeout(600)
def test_env_workers_step_on_their_nodes_and_a_killed_one_is_replaced(two_nodes, tmp_path):
    config = load_config(
        EXAMPLE,
        [*SMALL, "runner.iterations=3",
         "cluster={num_nodes: 2, component_placement: {actor: '0', env: '0-1:0-3'}}"],
    )  # fmt: skip
    placed, recoveries, killed = [], [], []

    def kill_one_env_worker(iteration, metrics):
        if iteration == 1:
            victim = next(p for p in placed if p.component == "env" and p.rank == 3)
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)

    result = train_distributed(
        config, distributed_plan(config), tmp_path, on_placed=placed.extend,
        on_metrics=kill_one_env_worker, on_recovery=lambda it, what: recoveries.append(what),
    )  # fmt: skip
    assert result.iteration == 3
    envs = sorted((p for p in placed if p.component == "env"), key=lambda p: p.rank)
    (actor,) = [p for p in placed if p.component == "actor"]
    assert [(p.rank, p.node_rank) for p in envs] == [(0, 0), (1, 0), (2, 1), (3, 1)]
    assert len({p.pid for p in envs} | {actor.pid}) == 5  # each in its own process
    # 8 copies over 4 workers, 2 each: every iteration still ran its whole batch.
    assert result.last_metrics["rollout/episodes"] >= 8
    (what,) = recoveries
    assert f"env worker 3 (node 1, pid {killed[0]})" in what and "restarted as pid" in what


@pytest.mark.timeout(600)
def test_two_ranks_with_their_own_env_workers_learn(two_nodes, tmp_path):
    config = load_config(
        EXAMPLE,
        ["runner.progress=false", "runner.torch_threads=1",
         "cluster={num_nodes: 2, component_placement: {actor: '0-1', env: '0-1'}}"],
    )  # fmt: skip
    history, placed = [], []
    result = train_distributed(
        config, distributed_plan(config), tmp_path, on_placed=placed.extend,
        on_metrics=lambda it, m: history.append(m),
    )  # fmt: skip
    assert sorted((p.component, p.rank, p.node_rank) for p in placed) == [
        ("actor", 0, 0), ("actor", 1, 1), ("env", 0, 0), ("env", 1, 1),
    ]  # fmt: skip
    assert result.per_rank[0]["parameters"] == result.per_rank[1]["parameters"]
    last = history[-3:]
    assert sum(m["rollout/success_rate"] for m in last) / 3 >= 0.8
