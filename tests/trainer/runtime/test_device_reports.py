"""Every computing process's device report reaches the run (torch.distributed over gloo,
real processes): rank 0's metrics hold each actor rank's and each rollout worker's
memory and utilisation under its process's name; a process alone keeps the plain keys.

A CPU has no device memory to report (`device_metrics` is empty there), so each process
here reports numbers of its own through the probe; tests/gpu reads a real GPU's."""

import pytest
import torch
import torch.multiprocessing as mp

from tests.trainer.runtime.test_gradient_sync import free_port
from trainer.algorithms.collective import Collective, TorchCollective
from trainer.devices import device_metrics
from trainer.runner.on_policy_runner import gather_device_metrics


def probe_of(process: int):
    def probe(device: torch.device) -> dict[str, float]:
        return {"device/memory_allocated_gb": 1.0 + process, "device/utilization": 10.0 * process}

    return probe


class WorkerDecider:
    """A rollout worker's answer, as `RemoteDecider.device_metrics` brings it back."""

    def __init__(self, rank: int) -> None:
        self.rank = rank

    def device_metrics(self) -> dict[str, float]:
        return {"device/memory_allocated_gb": 0.5 + self.rank}


def _rank(rank, world, port, out):
    collective = TorchCollective(rank, world, "127.0.0.1", port, timeout_s=60)
    try:
        cpu = torch.device("cpu")
        out[("ranks", rank)] = gather_device_metrics(collective, cpu, None, probe_of(rank))
        out[("workers", rank)] = gather_device_metrics(
            collective, cpu, WorkerDecider(rank), probe_of(rank)
        )
        out[("cpu", rank)] = gather_device_metrics(collective, cpu, None, device_metrics)
    finally:
        collective.close()


@pytest.fixture(scope="module")
def gathered() -> dict:
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, free_port(), out), nprocs=2, join=True)
        return dict(out)


@pytest.mark.timeout(120)
def test_every_actor_rank_reports_under_its_own_name(gathered):
    assert gathered[("ranks", 0)] == {
        "device/actor-0/memory_allocated_gb": 1.0,
        "device/actor-0/utilization": 0.0,
        "device/actor-1/memory_allocated_gb": 2.0,
        "device/actor-1/utilization": 10.0,
    }
    assert gathered[("ranks", 1)] == gathered[("ranks", 0)]  # a collective: all ranks get it


@pytest.mark.timeout(120)
def test_each_ranks_rollout_worker_reports_beside_its_rank(gathered):
    metrics = gathered[("workers", 0)]
    assert metrics["device/rollout-0/memory_allocated_gb"] == 0.5
    assert metrics["device/rollout-1/memory_allocated_gb"] == 1.5
    assert metrics["device/actor-1/memory_allocated_gb"] == 2.0


@pytest.mark.timeout(120)
def test_processes_on_the_cpu_report_nothing(gathered):
    assert gathered[("cpu", 0)] == {}


def test_a_process_alone_keeps_the_plain_keys():
    metrics = gather_device_metrics(Collective(), torch.device("cpu"), None, probe_of(3))
    assert metrics == {"device/memory_allocated_gb": 4.0, "device/utilization": 30.0}
    with_worker = gather_device_metrics(
        Collective(), torch.device("cpu"), WorkerDecider(0), probe_of(3)
    )
    assert with_worker == {
        "device/actor-0/memory_allocated_gb": 4.0,
        "device/actor-0/utilization": 30.0,
        "device/rollout-0/memory_allocated_gb": 0.5,
    }
