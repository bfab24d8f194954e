"""Interventions in on-policy runs whose env copies step in placed env workers: each
worker wraps its own copies (here for the scripted operator), and the steps a human
chose come back flagged with the step, chunk by chunk, across processes."""

import pytest

from tests.ray_cluster import labelled_ray_cluster
from trainer.config.loading import load_config
from trainer.runtime.distributed_run import distributed_plan, train_distributed

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def two_nodes():
    with labelled_ray_cluster([{"num_cpus": 1}, {"num_cpus": 1}]):
        yield


def scripted_config(tmp_path, *overrides: str):
    """PPO on the built-in env in chunks of five, the scripted operator on every step,
    over two nodes as `overrides` place it."""
    return load_config("examples/builtin_ppo.yaml", [
        "actor.model.num_action_chunks=5", "rollout.action_horizons_pattern=[5]",
        "algorithm.update_epochs=1", "algorithm.num_minibatches=1",
        "runner.progress=false", "runner.torch_threads=1", f"runner.output_dir={tmp_path}",
        "env.interventions.source=scripted", "env.interventions.share=1.0",
        "cluster.num_nodes=2", *overrides,
    ])  # fmt: skip


def test_an_operator_in_each_placed_worker_drives_every_step_of_its_chunks(two_nodes, tmp_path):
    config = scripted_config(
        tmp_path, "env.task_ids=[0]", "env.num_parallel_envs=4", "algorithm.data_batch_size=8",
        "runner.iterations=2",
        # One actor rank on node 0; its env copies in a worker on each node.
        "cluster.component_placement={actor: '0', env: '0-1'}",
    )  # fmt: skip
    history, placed, episodes = [], [], []
    result = train_distributed(
        config, distributed_plan(config), tmp_path, on_placed=placed.extend,
        on_metrics=lambda it, metrics: history.append(metrics),
        on_episodes=lambda first, rates: episodes.append((first, rates)),
    )  # fmt: skip
    assert result.iteration == 2
    assert sorted((p.component, p.node_rank) for p in placed) == [
        ("actor", 0), ("env", 0), ("env", 1)]  # fmt: skip
    for metrics in history:  # every step of every copy was the operator's, in both workers
        assert metrics["interventions/rate"] == 1.0
        assert metrics["interventions/episodes"] == 8  # two rounds of the four copies
        assert metrics["rollout/success_rate"] == 1.0  # the operator steers to the goal
    # Each episode's own rate reaches the driver, numbered across the run.
    assert episodes == [(1, [1.0] * 8), (9, [1.0] * 8)]


def test_actor_ranks_that_step_their_own_copies_each_wrap_them(two_nodes, tmp_path):
    config = scripted_config(
        tmp_path, "env.task_ids=[0,1]", "env.num_parallel_envs=2", "algorithm.data_batch_size=4",
        "runner.iterations=1",
        # An actor rank on each node (a task each), no env workers: each steps its own.
        "cluster.component_placement={actor: '0-1'}",
    )  # fmt: skip
    history, episodes = [], []
    result = train_distributed(
        config, distributed_plan(config), tmp_path,
        on_metrics=lambda it, metrics: history.append(metrics),
        on_episodes=lambda first, rates: episodes.append((first, rates)),
    )  # fmt: skip
    assert result.iteration == 1
    (metrics,) = history
    assert metrics["interventions/rate"] == 1.0
    assert metrics["interventions/episodes"] == 8  # both ranks' four episodes
    assert episodes == [(1, [1.0] * 8)]  # gathered from both ranks
