"""Env workers in parallel processes behave like the in-process env."""

import os
import signal
from functools import partial

import pytest
import torch

from trainer.envs import BuiltinReachEnv, make_vector_env
from trainer.envs.subproc_vector_env import SubprocVectorEnv
from trainer.envs.vector_env import EnvWorkerError

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def workers():
    env = make_vector_env("builtin_reach", num_envs=5, num_workers=2, max_episode_steps=10)
    yield env
    env.close()


def test_two_workers_step_exactly_like_one_process(workers):
    local = BuiltinReachEnv(num_envs=5, max_episode_steps=10)
    assert isinstance(workers, SubprocVectorEnv) and workers.shard_sizes == [3, 2]
    assert workers.obs_shape == local.obs_shape and workers.num_tasks == local.num_tasks
    assert workers.task_name(4) == local.task_name(4)
    assert torch.equal(workers.init_states(4), local.init_states(4))
    states = local.init_states(4)[[3, 1, 4, 1, 5]]
    assert torch.equal(workers.reset(4, states), local.reset(4, states))
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):  # crosses the time limit, so auto-reset and final obs are covered
        actions = torch.randn(5, 5, 7, generator=generator)
        ours, theirs = workers.step(actions), local.step(actions)
        for field in (
            "obs",
            "reward",
            "terminated",
            "truncated",
            "success",
            "executed_actions",
            "final_observation",
        ):
            assert torch.equal(getattr(ours, field), getattr(theirs, field)), field


def test_an_error_in_a_worker_is_raised_with_its_traceback(workers):
    workers.reset(0, workers.init_states(0)[:5])
    with pytest.raises(EnvWorkerError, match="env worker 0 failed while stepping"):
        workers.step(torch.zeros(5, 5, 6))


def test_a_dead_worker_is_reported_not_waited_for():
    workers = make_vector_env("builtin_reach", num_envs=2, num_workers=2)
    workers.reset(0, workers.init_states(0)[:2])
    victim = workers._processes[1]
    os.kill(victim.pid, signal.SIGKILL)  # a worker this test started
    victim.join(timeout=10)
    with pytest.raises(EnvWorkerError, match=r"env worker 1 \(pid \d+\) (exited|closed)"):
        workers.step(torch.zeros(2, 5, 7))
    workers.close()


def test_a_worker_killed_with_a_command_unread_is_reported_as_dead():
    """Its pipe is reset rather than closed: the read fails with ECONNRESET, not EOF."""
    workers = make_vector_env("builtin_reach", num_envs=2, num_workers=1)
    victim = workers._processes[0]
    os.kill(victim.pid, signal.SIGSTOP)  # it cannot read what is sent next
    workers._send(0, ("init_states", (0,)), "listing init states")
    os.kill(victim.pid, signal.SIGKILL)
    victim.join(timeout=10)
    with pytest.raises(EnvWorkerError, match=r"env worker 0 \(pid \d+\) exited with code -9 "
                       "while listing init states"):  # fmt: skip
        workers._receive(0, "listing init states")
    workers.close()


def test_worker_counts_are_checked():
    with pytest.raises(ValueError, match="num_workers must be in 1..num_envs"):
        SubprocVectorEnv(partial(BuiltinReachEnv), num_envs=2, num_workers=3)
