"""A run placed on two labelled Ray nodes (`ray.cluster_utils.Cluster`): one actor rank
per node where the plan says, the tasks sharded as seed 001 says, every rank's
parameters identical after training, rank 0's metrics and checkpoints relayed to the
driver, and the checkpoint carrying each rank's cursors so a resume continues them."""

import os
from pathlib import Path

import pytest

from tests.ray_cluster import labelled_ray_cluster
from trainer.config.loading import load_config
from trainer.runner.checkpoints import latest_checkpoint, load_checkpoint
from trainer.runtime.distributed_run import distributed_plan, train_distributed

pytestmark = pytest.mark.timeout(600)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_ppo.yaml"
SMALL = [
    "env.num_parallel_envs=4",
    "algorithm.data_batch_size=8",
    "algorithm.num_minibatches=2",
    "algorithm.update_epochs=2",
    "runner.checkpoint_every=2",
    "runner.progress=false",
    "runner.torch_threads=1",
    "cluster={num_nodes: 2, component_placement: {actor: '0-1'}}",
]


@pytest.fixture(scope="module")
def two_nodes():
    with labelled_ray_cluster([{"num_cpus": 1}, {"num_cpus": 1}]):
        yield


def test_two_ranks_on_two_nodes_shard_tasks_stay_in_sync_and_resume(two_nodes, tmp_path):
    config = load_config(EXAMPLE, [*SMALL, "env.task_ids=[0,1,2]", "runner.iterations=2"])
    plan = distributed_plan(config)
    assert [p.node_rank for p in plan.components["actor"]] == [0, 1]
    metrics, checkpoints = [], []
    result = train_distributed(
        config, plan, tmp_path, on_metrics=lambda it, m: metrics.append((it, m)),
        on_checkpoint=lambda it, path: checkpoints.append((it, path)),
    )  # fmt: skip
    assert result.iteration == 2 and [it for it, _ in metrics] == [1, 2]
    assert [r["tasks"] for r in result.per_rank] == [[0, 2], [1]]
    assert result.per_rank[0]["parameters"] == result.per_rank[1]["parameters"]
    assert len({r.pid for r in result.ranks}) == 2
    # Episodes of both ranks are counted: 8 trajectories per rank per iteration.
    assert metrics[-1][1]["rollout/episodes"] >= 16
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert [r["task_cursor"] for r in state["ranks"]] == [2, 2]
    assert checkpoints == [(2, tmp_path / "checkpoints" / "iter_000002.pt")]

    more = load_config(EXAMPLE, [*SMALL, "env.task_ids=[0,1,2]", "runner.iterations=3"])
    resumed = train_distributed(more, plan, tmp_path, resume=True)
    assert resumed.iteration == 3
    assert resumed.per_rank[0]["parameters"] == resumed.per_rank[1]["parameters"]
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    assert [r["task_cursor"] for r in state["ranks"]] == [3, 3]


def test_fsdp_ranks_stay_in_sync_and_their_checkpoint_shards_resume_under_ddp(two_nodes, tmp_path):
    sharded = load_config(EXAMPLE, [*SMALL, "actor.strategy=fsdp", "runner.iterations=2"])
    result = train_distributed(sharded, distributed_plan(sharded), tmp_path)
    assert result.iteration == 2
    assert result.per_rank[0]["parameters"] == result.per_rank[1]["parameters"]
    # Each rank wrote its shards beside the checkpoint file, which names them.
    state = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))
    shards = tmp_path / "checkpoints" / "iter_000002.shards"
    assert state["algorithm"]["shards"] == str(shards)
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]

    more = load_config(EXAMPLE, [*SMALL, "actor.strategy=ddp", "runner.iterations=3"])
    resumed = train_distributed(more, distributed_plan(more), tmp_path, resume=True)
    assert resumed.iteration == 3
    assert resumed.per_rank[0]["parameters"] == resumed.per_rank[1]["parameters"]


def test_more_ranks_than_tasks_leave_one_idle_in_the_sync(two_nodes, tmp_path):
    config = load_config(EXAMPLE, [*SMALL, "env.task_ids=[4]", "runner.iterations=1"])
    result = train_distributed(config, distributed_plan(config), tmp_path)
    assert [r["tasks"] for r in result.per_rank] == [[4], []]
    assert result.per_rank[0]["parameters"] == result.per_rank[1]["parameters"]
    assert result.last_metrics["rollout/episodes"] == 8


def test_two_ranks_learn_the_builtin_env(two_nodes, tmp_path):
    # The example's own budget, its six tasks split [0, 2, 4] / [1, 3, 5].
    config = load_config(
        EXAMPLE,
        ["runner.progress=false", "runner.torch_threads=1",
         "cluster={num_nodes: 2, component_placement: {actor: '0-1'}}"],
    )  # fmt: skip
    history = []
    result = train_distributed(
        config, distributed_plan(config), tmp_path, on_metrics=lambda it, m: history.append(m)
    )
    assert [r["tasks"] for r in result.per_rank] == [[0, 2, 4], [1, 3, 5]]
    assert result.per_rank[0]["parameters"] == result.per_rank[1]["parameters"]
    last = history[-3:]  # three iterations: every task once across the two ranks
    assert sum(m["rollout/success_rate"] for m in last) / 3 >= 0.8


def test_one_actor_placed_on_another_node_runs_there(two_nodes, tmp_path):
    """`actor: "1"` alone once ran in the driver on node 0 and said so; it is placed."""
    on_one = "cluster={num_nodes: 2, component_placement: {actor: '1'}}"
    config = load_config(EXAMPLE, [*SMALL[:-1], on_one, "runner.iterations=1"])
    plan = distributed_plan(config)
    assert [p.node_rank for p in plan.components["actor"]] == [1]
    result = train_distributed(config, plan, tmp_path)
    assert result.iteration == 1 and [r.node_rank for r in result.ranks] == [1]
    assert all(r.pid != os.getpid() for r in result.ranks)
    # On node 0 with nothing of its own, the one rank is this process, as before.
    here = "cluster={num_nodes: 2, component_placement: {actor: '0'}}"
    assert distributed_plan(load_config(EXAMPLE, [*SMALL[:-1], here])) is None
