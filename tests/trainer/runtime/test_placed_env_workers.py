"""Env workers as placed Ray actors: the plan's `env` processes split over the actor
ranks, each stepping a shard of its rank's copies on the node the plan names; a worker
killed mid-run is restarted on its placement and the iteration redone."""

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.ray_cluster import labelled_ray_cluster
from trainer.cluster import cluster_from_dict, resolve_placement
from trainer.config.env_shards import assign_env_shards
from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.runtime.distributed_run import distributed_plan, train_distributed

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
        [*SMALL, "runner.iterations=3", "runner.videos.every=2", "runner.videos.size=32",
         "cluster={num_nodes: 2, component_placement: {actor: '0', env: '0-1:0-3'}}"],
    )  # fmt: skip
    placed, recoveries, killed, videos = [], [], [], []

    def kill_one_env_worker(iteration, metrics):
        if iteration == 1:
            victim = next(p for p in placed if p.component == "env" and p.rank == 3)
            os.kill(victim.pid, signal.SIGKILL)
            killed.append(victim.pid)

    result = train_distributed(
        config, distributed_plan(config), tmp_path, on_placed=placed.extend,
        on_metrics=kill_one_env_worker, on_recovery=lambda it, what: recoveries.append(what),
        on_video=videos.append,
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
    # Iterations 1 and 3 recorded episodes of copies the workers pictured, into the
    # run's folder, each told to the driver.
    assert sorted({video["iteration"] for video in videos}) == [1, 3]
    assert all((tmp_path / "videos" / video["file"]).stat().st_size for video in videos)


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


def test_pipeline_stages_need_enough_placed_env_workers():
    with pytest.raises(ConfigError, match="rollout.pipeline_stages: 2 stages need placed env"):
        load_config(EXAMPLE, [*SMALL, "rollout.pipeline_stages=2"])
    one_each = "cluster={num_nodes: 2, component_placement: {actor: '0-1', env: '0-1'}}"
    with pytest.raises(ConfigError, match="at least 2 env workers per actor rank; a rank has 1"):
        load_config(EXAMPLE, [*SMALL, "rollout.pipeline_stages=2", one_each])


@pytest.mark.timeout(600)
def test_a_pipelined_round_runs_the_episodes_the_plain_round_runs(two_nodes):
    """Two stages of one worker each against the same workers stepped at once, with a
    policy whose noise is negligible (std e^-20): the same episodes, step for step, and
    the same pictures of the first stage's copies recorded for videos."""
    import ray
    import torch

    from trainer.config.env_shards import EnvShard
    from trainer.envs.pictures import pictures_of
    from trainer.models.plan_cache import assign_horizons
    from trainer.runner.build import build_components, env_options
    from trainer.runner.collection import run_round
    from trainer.runtime.env_workers import EnvWorker, PlacedVectorEnv, env_worker_args
    from trainer.videos.capture import RoundCapture

    config = load_config(
        EXAMPLE, [*SMALL, "env.num_parallel_envs=6", "actor.model.init_log_std=-20"]
    )
    shards = [EnvShard(process, 3) for process in env_processes("0-1")]
    make_args = env_worker_args(config.env.name, env_options(config))
    workers = [(shard, ray.remote(EnvWorker).remote(*make_args(shard))) for shard in shards]
    env = PlacedVectorEnv(workers, config.env.name, env_options(config))
    try:
        algorithm = build_components(config, torch.Generator().manual_seed(0), env=env).algorithm
        horizons = assign_horizons(config.rollout.action_horizons_pattern, env.num_envs)
        steps = env.max_episode_steps
        indices = [0, 1, 2, 3, 4, 5]
        # Copies 0 and 1 (the first stage's) recorded for videos, pictured by their worker.
        pictures = pictures_of(env, 32)
        captures = {
            stages: RoundCapture(pictures, [0, 1], 1, [{}, {}], lambda copy: f"c{copy}")
            for stages in (1, 2)
        }  # fmt: skip
        rounds = {
            stages: run_round(env, algorithm, 1, indices, horizons, steps, 12, 2, stages,
                              captures[stages])
            for stages in (1, 2)
        }  # fmt: skip
    finally:
        env.close()
    plain_clips, pipelined_clips = (captures[stages].clips(2) for stages in (1, 2))
    for plain_clip, pipelined_clip in zip(plain_clips, pipelined_clips, strict=True):
        assert pipelined_clip.actors == plain_clip.actors
        assert pipelined_clip.rewards == plain_clip.rewards
        assert pipelined_clip.frames.shape == plain_clip.frames.shape
        assert len(plain_clip.frames) == len(plain_clip.actors)
        assert np.abs(pipelined_clip.frames.astype(int) - plain_clip.frames).max() <= 1
    plain, pipelined = rounds[1], rounds[2]
    assert torch.equal(plain.valid, pipelined.valid)
    assert torch.equal(plain.episode_success, pipelined.episode_success)
    for field in ("horizon", "group_index", "init_state_index", "task_id"):
        assert torch.equal(getattr(plain, field), getattr(pipelined, field)), field
    torch.testing.assert_close(pipelined.obs, plain.obs, atol=1e-4, rtol=0)
    torch.testing.assert_close(pipelined.value, plain.value, atol=1e-4, rtol=0)
    assert plain.group_index.tolist() == [12, 12, 13, 13, 14, 14]


def test_rollout_workers_come_one_per_actor_rank():
    two_for_one = "cluster={num_nodes: 2, component_placement: {actor: '0', rollout: '0-1'}}"
    with pytest.raises(ConfigError, match="2 rollout process\\(es\\) for 1 actor rank"):
        load_config(EXAMPLE, [*SMALL, two_for_one])
    staged = "cluster={num_nodes: 2, component_placement: {actor: '0', env: '0-1', rollout: '1'}}"
    with pytest.raises(ConfigError, match="rollout.pipeline_stages: pipeline stages decide"):
        load_config(EXAMPLE, [*SMALL, "rollout.pipeline_stages=2", staged])
    one = "cluster={num_nodes: 2, component_placement: {actor: '0', rollout: '1'}}"
    assert distributed_plan(load_config(EXAMPLE, [*SMALL, one])) is not None


@pytest.mark.timeout(600)
def test_a_rollout_worker_decides_what_the_rank_would(two_nodes):
    """The same round with the rank's own decisions and with its rollout worker's on
    node 1, with a policy whose noise is negligible (std e^-20): the same episodes."""
    import ray
    import torch

    from trainer.models.plan_cache import assign_horizons
    from trainer.runner.build import build_components
    from trainer.runner.collection import run_round
    from trainer.runtime.ray_placement import create_placed_actors
    from trainer.runtime.rollout_workers import RemoteDecider, RolloutWorker
    from trainer.whereabouts import ProcessReport

    placed = "cluster={num_nodes: 2, component_placement: {actor: '0', rollout: '1'}}"
    config = load_config(EXAMPLE, [*SMALL, "actor.model.init_log_std=-20", placed])
    components = build_components(config, torch.Generator().manual_seed(0))
    env, algorithm = components.env, components.algorithm
    (worker,) = create_placed_actors(
        ray.remote(RolloutWorker), distributed_plan(config), components=["rollout"],
        constructor_args=lambda p: (config.model_dump(mode="json"), p.process_rank, p.node_rank),
    )  # fmt: skip
    try:
        report = ProcessReport(**ray.get(worker.handle.prepare.remote(env.obs_shape, 7)))
        horizons = assign_horizons(config.rollout.action_horizons_pattern, env.num_envs)
        steps, indices = env.max_episode_steps, list(range(env.num_envs))
        own = run_round(env, algorithm, 0, indices, horizons, steps)
        algorithm.decider = RemoteDecider(worker.handle, report)
        remote = run_round(env, algorithm, 0, indices, horizons, steps)
    finally:
        env.close()
        ray.kill(worker.handle)
    assert report.component == "rollout" and report.node_rank == 1
    assert report.pid != os.getpid()
    assert torch.equal(own.valid, remote.valid)
    assert torch.equal(own.episode_success, remote.episode_success)
    torch.testing.assert_close(remote.obs, own.obs, atol=1e-4, rtol=0)
    # The log-probabilities come from each side's own noise draws: only their shapes and
    # the rows they are stored for can agree.
    assert remote.log_prob.shape == own.log_prob.shape
    assert bool(remote.log_prob[remote.valid].isfinite().all())


@pytest.mark.timeout(600)
def test_a_run_with_a_rollout_worker_trains_and_reports_it(two_nodes, tmp_path):
    placed = "cluster={num_nodes: 2, component_placement: {actor: '0', rollout: '1'}}"
    config = load_config(EXAMPLE, [*SMALL, "runner.iterations=2", placed])
    where = []
    result = train_distributed(config, distributed_plan(config), tmp_path, on_placed=where.extend)
    assert result.iteration == 2 and result.last_metrics["rollout/episodes"] >= 8
    assert sorted((p.component, p.rank, p.node_rank) for p in where) == [
        ("actor", 0, 0), ("rollout", 0, 1),
    ]  # fmt: skip


def test_each_env_worker_of_real_arms_gets_the_arms_of_its_own_copies():
    from trainer.runtime.env_workers import shard_options

    shards = assign_env_shards(env_processes("0-2", nodes=3), 1, 5)[0]
    assert [(shard.first_copy, shard.num_envs) for shard in shards] == [(0, 2), (2, 2), (4, 1)]
    arms = {"robots": [{"name": f"arm-{n}"} for n in range(5)], "task": "t"}
    names = [[r["name"] for r in shard_options(arms, shard)["robots"]] for shard in shards]
    assert names == [["arm-0", "arm-1"], ["arm-2", "arm-3"], ["arm-4"]]
    assert shard_options({"seed": 1}, shards[1]) == {"seed": 1}  # simulated copies: as they are
