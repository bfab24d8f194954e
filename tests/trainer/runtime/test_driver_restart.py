"""The driver of a distributed run killed mid-run (SIGKILL: no chance to clean up): its
ranks and env workers go with it, and `python -m trainer run --resume` continues from
the last checkpoint with the same task and init-state cursors, ending where a run that
was never interrupted ends."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import torch

from tests.processes import wait_until
from tests.ray_cluster import labelled_ray_cluster
from trainer.runner.checkpoints import checkpoint_path, latest_checkpoint, load_checkpoint

pytestmark = pytest.mark.timeout(900)

ROOT = Path(__file__).resolve().parents[3]
# Enough that a kill at iteration 2 lands mid-run even when the test, on a loaded machine,
# notices iteration 2's checkpoint late (at 5 the run once finished first).
ITERATIONS = 14  # room for a SIGKILL that lands late on a loaded machine
ARGS = [
    str(ROOT / "examples" / "builtin_ppo.yaml"),
    "env.num_parallel_envs=4", "algorithm.data_batch_size=8", "algorithm.num_minibatches=2",
    "algorithm.update_epochs=2", "runner.checkpoint_every=1", "runner.progress=false",
    "runner.torch_threads=1", "env.task_ids=[0,1,2]", f"runner.iterations={ITERATIONS}",
    "cluster={num_nodes: 2, component_placement: {actor: '0-1', env: '0-1'}}",
]  # fmt: skip


@pytest.fixture(scope="module")
def cluster_address():
    with labelled_ray_cluster([{"num_cpus": 1}, {"num_cpus": 1}]):
        yield ray.get_runtime_context().gcs_address


def trainer(output: Path, address: str, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "RAY_ADDRESS": address, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "trainer", "run", *ARGS, "--output-dir", str(output), *extra],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def finish(process: subprocess.Popen) -> str:
    output, _ = process.communicate(timeout=600)
    assert process.returncode == 0, output
    return output


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}").exists() and "zombie" not in Path(f"/proc/{pid}/status").read_text()


def test_a_killed_driver_leaves_nothing_running_and_resume_continues_the_cursors(
    cluster_address, tmp_path
):
    reference = tmp_path / "uninterrupted"
    finish(trainer(reference, cluster_address))

    run = tmp_path / "killed"
    driver = trainer(run, cluster_address)
    try:
        wait_until(lambda: checkpoint_path(run / "checkpoints", 1).exists(), 300, "iteration 1")
    finally:
        driver.send_signal(signal.SIGKILL)
        printed, _ = driver.communicate()
    # The driver printed where its ranks and env workers run: all four go with it.
    pids = [int(pid) for pid in re.findall(r"\(pid (\d+)\)", printed)]
    assert len(pids) == 4, printed
    wait_until(lambda: not any(alive(pid) for pid in pids), 60, "the driver's actors to go", 1)
    killed_at = load_checkpoint(latest_checkpoint(run / "checkpoints"))["iteration"]
    assert killed_at < ITERATIONS

    output = finish(trainer(run, cluster_address, "--resume"))
    assert f"finished {ITERATIONS}/{ITERATIONS} iterations on 2 actor rank(s) and 2 env" in output
    resumed = load_checkpoint(checkpoint_path(run / "checkpoints", ITERATIONS))
    expected = load_checkpoint(checkpoint_path(reference / "checkpoints", ITERATIONS))
    for rank, want in zip(resumed["ranks"], expected["ranks"], strict=True):
        assert rank["task_cursor"] == want["task_cursor"]
        assert rank["init_states"] == want["init_states"]
        assert rank["next_group_index"] == want["next_group_index"]
    assert resumed["total_env_steps"] == expected["total_env_steps"]
    policy, want = resumed["algorithm"]["policy"], expected["algorithm"]["policy"]
    assert all(torch.equal(policy[name], want[name]) for name in want)


def test_sigterm_stops_a_placed_run_with_a_checkpoint_and_resume_finishes_it(
    cluster_address, tmp_path
):
    """What stopping a run's Ray job does: the driver is sent SIGTERM. Joining Ray
    replaces the handler the run installed; it must be the run's that answers."""
    run = tmp_path / "stopped"
    driver = trainer(run, cluster_address)
    try:
        wait_until(lambda: checkpoint_path(run / "checkpoints", 1).exists(), 300, "iteration 1")
    finally:
        driver.send_signal(signal.SIGTERM)
        printed, _ = driver.communicate(timeout=300)
    assert driver.returncode == 130, printed  # stopped, not killed (-15)
    stopped_at = load_checkpoint(latest_checkpoint(run / "checkpoints"))["iteration"]
    assert f"stopped by SIGTERM after {stopped_at}/{ITERATIONS} iterations" in printed
    assert "checkpoint saved, continue with --resume" in printed

    output = finish(trainer(run, cluster_address, "--resume"))
    assert f"finished {ITERATIONS}/{ITERATIONS} iterations" in output
