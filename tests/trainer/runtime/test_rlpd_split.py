"""RLPD's learner and acting env workers as placed Ray processes on a two-node cluster:
transitions stream from every worker into the learner's buffers while it trains, the
workers act with the weights it publishes, and a stalled worker or learner is reported
within the exchange deadline instead of being waited on."""

import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from ray.util.queue import Queue

from tests.ray_cluster import labelled_ray_cluster
from trainer.config.errors import ConfigError
from trainer.config.loading import load_config
from trainer.runner.checkpoints import load_checkpoint
from trainer.runtime.distributed_run import distributed_plan
from trainer.runtime.rlpd_split import (
    QUEUE_MESSAGES,
    ExchangeTimeout,
    RLPDActors,
    check_rlpd_plan,
    train_rlpd_split,
)
from trainer.whereabouts import ProcessReport

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_rlpd.yaml"
SPLIT = "cluster={num_nodes: 2, component_placement: {actor: '0', env: '0-1'}}"
SMALL = ["runner.progress=false", "env.num_parallel_envs=6", "algorithm.rlpd.training_starts=60"]


def config(tmp_path: Path, *overrides: str):
    return load_config(EXAMPLE, [*SMALL, f"runner.output_dir={tmp_path}", SPLIT, *overrides])


def test_rlpd_has_one_learner():
    two = "cluster={num_nodes: 2, component_placement: {actor: '0-1', env: '0-1'}}"
    plan = distributed_plan(load_config(EXAMPLE, [*SMALL, two]))
    with pytest.raises(ConfigError, match="rlpd has one learner: place exactly one actor"):
        check_rlpd_plan(plan)


@pytest.fixture(scope="module")
def two_nodes():
    with labelled_ray_cluster([{"num_cpus": 1}, {"num_cpus": 1}]):
        yield


@pytest.mark.timeout(600)
def test_workers_stream_into_the_learner_and_act_with_its_weights(two_nodes, tmp_path):
    run = config(tmp_path, "runner.iterations=4", "algorithm.rlpd.publish_every=5")
    placed, history, checkpoints, episodes = [], [], [], []
    result = train_rlpd_split(
        run, distributed_plan(run), tmp_path,
        on_placed=placed.extend, on_metrics=lambda it, m: history.append((it, m)),
        on_checkpoint=lambda it, path: checkpoints.append(path),
        on_episodes=lambda first, rates: episodes.append((first, len(rates))),
    )  # fmt: skip
    assert result.iteration == 4
    assert [(p.component, p.rank, p.node_rank) for p in placed] == [
        ("actor", 0, 0), ("env", 0, 0), ("env", 1, 1),
    ]  # fmt: skip
    assert len({p.pid for p in placed}) == 3 and os.getpid() not in {p.pid for p in placed}
    assert [it for it, _ in history] == [1, 2, 3, 4]
    last = history[-1][1]
    # Every step of every copy of both workers reached the learner's online buffer.
    assert last["buffers/online"] == last["charts/env_steps"] > 0
    assert last["rollout/episodes"] == 6  # both workers' copies, one episode each
    assert "rollout/success_rate_task_0" in last
    assert last["rlpd/updates"] > 0
    # Past training_starts the workers act with published weights, a few updates old.
    lags = [m["rlpd/policy_lag"] for _, m in history if "rlpd/policy_lag" in m]
    assert lags and all(lag >= 0 for lag in lags)
    assert last["interventions/steps"] > 0  # the scripted operator runs in the workers
    # Each episode's intervention rate, the six copies' episodes of each iteration.
    assert episodes == [(1, 6), (7, 6), (13, 6), (19, 6)]
    assert checkpoints and checkpoints[-1].exists()


@pytest.mark.timeout(600)
def test_a_split_run_resumes_from_its_checkpoint_with_its_buffers(two_nodes, tmp_path):
    first = config(tmp_path, "runner.iterations=2")
    train_rlpd_split(first, distributed_plan(first), tmp_path)
    resumed = config(tmp_path, "runner.iterations=3")
    history = []
    result = train_rlpd_split(
        resumed, distributed_plan(resumed), tmp_path, resume=True,
        on_metrics=lambda it, m: history.append((it, m)),
    )  # fmt: skip
    assert result.iteration == 3 and [it for it, _ in history] == [3]
    metrics = history[0][1]
    # The online buffer holds the first two iterations' steps as well as the third's.
    assert metrics["buffers/online"] == metrics["charts/env_steps"]
    assert metrics["charts/env_steps"] > metrics["rollout/episode_length"] * 6


@pytest.mark.timeout(600)
@pytest.mark.parametrize("victim", ["env", "actor"])
def test_a_stalled_worker_or_learner_is_reported_within_the_deadline(two_nodes, tmp_path, victim):
    # Long enough that a busy 2-core machine (CI runs two test sessions side by side)
    # never makes a healthy worker look stalled.
    run = config(tmp_path, "runner.iterations=50", "algorithm.rlpd.exchange_timeout_s=8")
    placed, stopped = [], []

    def stall() -> None:
        process = next(p for p in placed if p.component == victim and p.rank == 0)
        os.kill(process.pid, signal.SIGSTOP)
        stopped.append(process.pid)

    def on_placed(processes) -> None:
        placed.extend(processes)
        # The learner judges its workers too: stopped once it learns, it may already have
        # named a worker that a loaded machine kept from sending (as in one CI run).
        # Stopped before it learns, only the driver can judge, and it names the learner.
        if victim == "actor":
            stall()

    def on_metrics(iteration, metrics) -> None:
        if iteration == 1 and not stopped:  # a worker stops mid-run
            stall()

    try:
        with pytest.raises(ExchangeTimeout) as raised:
            train_rlpd_split(
                run, distributed_plan(run), tmp_path, on_placed=on_placed, on_metrics=on_metrics
            )
    finally:
        for pid in stopped:  # killed by the run's clean-up; resumed in case it was not
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    message = str(raised.value)
    if victim == "env":
        assert "env worker 0 on node 0" in message and "stalled actor" in message
    else:
        assert "the learner on node 0" in message and "stalled learner" in message
    assert "8 s" in message


class _SlowLearner:
    """Pays for each worker's rows with updates that together outlast the deadline."""

    def __init__(self, seconds: float):
        self.seconds, self.took = seconds, []

    def take_step(self, rows: str) -> None:
        time.sleep(self.seconds)
        self.took.append(rows)


def test_a_worker_is_heard_when_its_rows_are_seen_not_when_a_slow_learner_trains_on_them(
    two_nodes,
):
    # A learner whose updates take longer than the deadline (a big model, a busy machine)
    # must not blame the workers whose rows waited for them: it was not looking.
    report = {"where": ProcessReport.here("env", 0, 0).to_json(), "obs_shape": [4],
              "action_dim": 2, "num_tasks": 1, "init_state_counts": [1]}  # fmt: skip
    sent = Queue(maxsize=QUEUE_MESSAGES)
    for item in [(0, "a"), (1, "b"), (0, "c")]:
        sent.put(item)
    settings = SimpleNamespace(publish_every=1, exchange_timeout_s=0.2)
    actors = RLPDActors([], [report, report], [3, 3], sent, settings)
    learner, heard = _SlowLearner(0.15), [0.0, 0.0]
    looked = actors._take_transitions(learner, heard)
    assert learner.took == ["a", "b", "c"] and sent.empty()
    assert time.monotonic() - looked > 0.45 > settings.exchange_timeout_s
    assert heard == [looked, looked]  # both seen at the look, neither past the deadline
    sent.shutdown()


def _first_iteration_transitions(tmp_path: Path) -> torch.Tensor:
    """Every online transition of a one-iteration split run, one row each, sorted: the
    workers' messages reach the learner in either order, what they hold must not vary."""
    # training_starts 0: the workers act with the policy (its sampling noise) from the
    # first step, with the weights published at the iteration's start and no others.
    run = config(
        tmp_path, "runner.iterations=1", "algorithm.rlpd.training_starts=0",
        "algorithm.rlpd.publish_every=1000000", "env.interventions.source=none",
    )  # fmt: skip
    train_rlpd_split(run, distributed_plan(run), tmp_path)
    online = load_checkpoint(tmp_path / "buffers/iter_000001.pt")["online"]
    size = online["size"]
    fields = online["fields"]
    rows = torch.cat(
        [fields[name][:size].reshape(size, -1).double() for name in sorted(fields)], dim=1
    )
    return rows[torch.from_numpy(np.lexsort(rows.T.flip(0).numpy()))]


@pytest.mark.timeout(600)
def test_two_split_runs_with_the_same_seed_act_alike_in_their_first_iteration(two_nodes, tmp_path):
    first = _first_iteration_transitions(tmp_path / "a")
    second = _first_iteration_transitions(tmp_path / "b")
    assert first.shape[0] > 6  # every copy's episode, step by step
    assert torch.equal(first, second)  # the same weights and noise, the same rows
