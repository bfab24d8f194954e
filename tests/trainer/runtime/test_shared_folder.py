"""A placed run whose actor rank runs on a node that does not see the run folder fails
at start, naming the node, instead of succeeding with its checkpoints on that node's
own disk. Node 1 runs in a private mount namespace where the run folder is an empty
tmpfs: what two machines without shared storage look like."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import ray

from tests.processes import wait_until
from tests.ray_cluster import labelled_ray_cluster
from trainer.cluster import NODE_RANK_LABEL
from trainer.config.loading import load_config
from trainer.runtime.distributed_run import distributed_plan, train_distributed
from trainer.runtime.shared_folder import UnsharedRunFolder

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[3]
RAY = Path(sys.executable).parent / "ray"


def can_unshare_mounts() -> bool:
    try:
        done = subprocess.run(["unshare", "-m", "true"], capture_output=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


@pytest.fixture
def node_with_its_own_disk(tmp_path):
    """Node 0 here; node 1 a `ray start` in its own mount namespace, where `folder` is
    an empty tmpfs. Yields `folder`."""
    if not can_unshare_mounts():
        pytest.skip("mount namespaces cannot be created here (needs root or user namespaces)")
    folder = tmp_path / "runs"
    folder.mkdir()
    with labelled_ray_cluster([{"num_cpus": 1}]):
        address = ray.get_runtime_context().gcs_address
        start = (
            f"mount -t tmpfs tmpfs {folder} && exec {RAY} start --block --disable-usage-stats "
            f"--address={address} --num-cpus=1 --labels={NODE_RANK_LABEL}=1"
        )
        node = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", start],
            env={**os.environ, "RAY_AUTH_MODE": "disabled"}, start_new_session=True,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            wait_until(
                lambda: sum(n["Alive"] for n in ray.nodes()) == 2, 120, "node 1 to join", 0.5
            )
            yield folder
        finally:
            os.killpg(node.pid, signal.SIGTERM)  # `ray start --block` stops its node
            try:
                node.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(node.pid, signal.SIGKILL)
                node.wait()


def test_a_rank_on_a_node_without_the_run_folder_fails_the_run_at_start(node_with_its_own_disk):
    folder = node_with_its_own_disk
    config = load_config(
        ROOT / "examples" / "builtin_ppo.yaml",
        ["env.num_parallel_envs=4", "algorithm.data_batch_size=8", "runner.iterations=1",
         "runner.progress=false", "runner.torch_threads=1",
         "cluster={num_nodes: 2, component_placement: {actor: '0-1'}}"],
    )  # fmt: skip
    with pytest.raises(UnsharedRunFolder) as refused:
        train_distributed(config, distributed_plan(config), folder / "run-1")
    message = str(refused.value)
    assert "actor rank 1 on node 1 cannot see the run folder" in message
    assert "actor rank 0" not in message  # node 0 shares the driver's disk
    assert not list((folder / "run-1").glob(".shared-folder-check-*"))  # cleaned up
