"""A multi-node Ray cluster on this machine (`ray.cluster_utils.Cluster`), its nodes
labelled with their Armature node rank, connected for the test module."""

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ray
from ray.cluster_utils import Cluster

from controlplane.core.head_keeper import RAY_START_DEADLINE
from tests.processes import RAY_STARTS, free_port, pids_with_env
from trainer.cluster import NODE_RANK_LABEL

OBJECT_STORE_BYTES = 100 * 2**20


@contextlib.contextmanager
def labelled_ray_cluster(nodes: Sequence[dict[str, Any]]) -> Iterator[Path]:
    """Start one node per entry of `nodes` (`ray start` arguments, e.g. num_cpus,
    num_gpus), node i labelled rank i, and `ray.init` to it; yields the cluster's
    temporary folder. Everything is shut down and removed afterwards."""
    # A short private temp dir: Ray's socket paths must stay under the Unix limit.
    tmp = tempfile.mkdtemp(prefix="armray-")
    saved = {key: os.environ.get(key) for key in ("RAY_TMPDIR", "RAY_AUTH_MODE")}
    os.environ.update(RAY_TMPDIR=tmp, RAY_AUTH_MODE="disabled")
    cluster = None
    try:
        cluster = _start(nodes, tmp)
        ray.init(address=cluster.address)
        yield Path(tmp)
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        _remove(tmp)


def _start(nodes: Sequence[dict[str, Any]], tmp: str) -> Cluster:
    """The cluster's nodes, all started again when one exits at Ray's own start-up
    deadline (tests/processes.py)."""
    for attempt in range(1, RAY_STARTS + 1):
        cluster = Cluster()
        try:
            for rank, node in enumerate(nodes):
                cluster.add_node(
                    **node,
                    labels={NODE_RANK_LABEL: str(rank)},
                    object_store_memory=OBJECT_STORE_BYTES,
                    **({"include_dashboard": False, "gcs_server_port": free_port()}
                       if rank == 0 else {}),  # 6379 belongs to Redis here
                )  # fmt: skip
            return cluster
        except Exception as error:
            cluster.shutdown()
            # A node that failed to start was never handed to the cluster: its processes
            # are found by the temp folder every process of this cluster has in its env.
            for pid in pids_with_env("RAY_TMPDIR", tmp):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if RAY_START_DEADLINE not in str(error) or attempt == RAY_STARTS:
                raise
    raise AssertionError("RAY_STARTS must be at least 1")


def _remove(path: str) -> None:
    """Exiting Ray workers may still write logs for a moment after shutdown: retry briefly."""
    deadline = time.monotonic() + 10
    while os.path.exists(path) and time.monotonic() < deadline:
        shutil.rmtree(path, ignore_errors=True)
        time.sleep(0.2)
