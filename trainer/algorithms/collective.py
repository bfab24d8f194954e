"""What actor ranks exchange, behind one small interface: summed counts and tensors,
agreed flags, rank 0's parameters, everyone's small state.

`Collective` is one process on its own (every call is the identity), so the runner and
the algorithms run the same code single-process and distributed. `TorchCollective`
is torch.distributed: gloo on CPUs; on GPUs, NCCL for the tensors the update sums
(gradient buckets, advantage moments), while counts, flags and objects —
tiny, and on the CPU — cross through a gloo group beside it.
"""

from __future__ import annotations

import datetime
from collections import Counter
from typing import Any

import torch
from torch import nn


class Collective:
    """A world of one rank."""

    rank = 0
    world_size = 1

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (in place where distributed; returned)."""
        return tensor

    def sum_tensor_async(self, tensor: torch.Tensor) -> Any:
        """`sum_tensor` started in the background: wait() on what it returns."""
        return _Done()

    def sum_counts(self, counts: Counter[str]) -> Counter[str]:
        """Every rank's counts summed, keys that only some ranks have included."""
        return counts

    def any(self, flag: bool) -> bool:
        """True on every rank when it is True on some rank."""
        return flag

    def broadcast_module(self, module: nn.Module) -> None:
        """Give every rank rank 0's parameters and buffers."""

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's `value`, in rank order, on every rank."""
        return [value]

    def close(self) -> None:
        pass


class TorchCollective(Collective):
    """torch.distributed over a TCP rendezvous at rank 0's `address:port`."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        address: str,
        port: int,
        backend: str = "gloo",
        timeout_s: float = 300.0,
        device: torch.device | None = None,
    ) -> None:
        """`device`: the rank's GPU when `backend` is nccl (bound before the group forms)."""
        # Imported here: one process never pays for torch.distributed's import.
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world_size = rank, world_size
        if backend == "nccl":
            assert device is not None and device.type == "cuda", "nccl needs the rank's GPU"
            torch.cuda.set_device(device)
        # The timeout bounds every collective: a rank that hangs makes the others
        # fail with an error instead of waiting forever.
        timeout = datetime.timedelta(seconds=timeout_s)
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=timeout,
        )
        # Counts, flags and objects live on the CPU: NCCL cannot carry them.
        self.cpu_group = (
            dist.new_group(backend="gloo", timeout=timeout) if backend == "nccl" else None
        )

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)
        return tensor

    def sum_tensor_async(self, tensor: torch.Tensor) -> Any:
        return self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM, async_op=True)

    def sum_counts(self, counts: Counter[str]) -> Counter[str]:
        keys = sorted(set().union(*self.gather_objects(sorted(counts))))
        values = torch.tensor([float(counts.get(key, 0.0)) for key in keys], dtype=torch.float64)
        self.dist.all_reduce(values, op=self.dist.ReduceOp.SUM, group=self.cpu_group)
        return Counter(dict(zip(keys, values.tolist(), strict=True)))

    def any(self, flag: bool) -> bool:
        value = torch.tensor([1.0 if flag else 0.0])
        self.dist.all_reduce(value, op=self.dist.ReduceOp.MAX, group=self.cpu_group)
        return bool(value.item())

    def broadcast_module(self, module: nn.Module) -> None:
        with torch.no_grad():
            for tensor in module.state_dict().values():
                self.dist.broadcast(tensor, src=0)

    def gather_objects(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(gathered, value, group=self.cpu_group)
        return gathered

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()


class _Done:
    """A collective that had nothing to wait for."""

    def wait(self) -> bool:
        return True
