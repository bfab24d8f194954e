"""Faults of env workers (real processes): a worker killed mid-run is restarted and its
iteration redone from the same init states, the recovery reported; a hung worker is
caught by its reply timeout; retries are bounded and the run then fails with the
reason."""

import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest
import torch

from trainer.config.loading import load_config
from trainer.envs import BuiltinReachEnv
from trainer.envs.subproc_vector_env import SubprocVectorEnv
from trainer.envs.vector_env import EnvWorkerError
from trainer.runner.on_policy_runner import OnPolicyRunner

pytestmark = pytest.mark.timeout(300)

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "builtin_ppo.yaml"
SMALL = [
    "env.num_workers=2", "env.num_parallel_envs=4", "algorithm.data_batch_size=4",
    "runner.iterations=3", "runner.progress=false", "env.task_ids=[0]",
]  # fmt: skip


def kill(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)


def test_a_killed_env_worker_is_restarted_and_its_iteration_redone(tmp_path):
    config = load_config(EXAMPLE, SMALL)
    recoveries = []
    runner = OnPolicyRunner(
        config, output_dir=tmp_path, on_recovery=lambda it, what: recoveries.append((it, what))
    )
    victim = runner.env._processes[1].pid
    killed = []

    def kill_once(iteration, metrics):
        if iteration == 1 and not killed:
            kill(victim)
            killed.append(victim)

    runner.on_metrics = kill_once
    try:
        history = runner.learn()
        assert len(history) == 3 and runner.iteration == 3
        ((iteration, what),) = recoveries
        assert iteration == 2 and f"pid {victim}" in what and "restarted as pid" in what
        assert runner.env._processes[1].pid != victim and runner.env._processes[1].is_alive()
        # Redone from the same init states: 4 per round, 3 iterations -> cursor at 12.
        assert runner.init_states.state_dict() == {0: 12}
    finally:
        runner.close()


def test_retries_are_bounded_then_the_reason_is_raised(tmp_path):
    config = load_config(EXAMPLE, [*SMALL, "runner.env_worker_retries=1"])
    runner = OnPolicyRunner(config, output_dir=tmp_path)
    original = runner.env.restart_workers

    def restart_then_kill_again():
        restarted = original()
        kill(runner.env._processes[0].pid)
        return restarted

    runner.env.restart_workers = restart_then_kill_again
    kill(runner.env._processes[0].pid)
    try:
        with pytest.raises(EnvWorkerError, match="given up after 1 restart"):
            runner.learn()
    finally:
        runner.close()


class Hangs(BuiltinReachEnv):
    def step(self, actions):
        time.sleep(3600)


def test_a_hung_worker_is_caught_by_its_reply_timeout():
    env = SubprocVectorEnv(partial(Hangs), num_envs=2, num_workers=1, reply_timeout_s=2)
    try:
        env.reset(0, env.init_states(0)[:2])
        started = time.monotonic()
        with pytest.raises(EnvWorkerError, match="did not answer within 2 s"):
            env.step(torch.zeros(2, 1, env.action_dim))
        assert time.monotonic() - started < 60
        assert not env._processes[0].is_alive()
        (line,) = env.restart_workers()
        assert "restarted as pid" in line and env._processes[0].is_alive()
    finally:
        env.close()
