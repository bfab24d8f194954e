"""What actor ranks exchange, behind one small interface: summed counts and tensors,
agreed flags, rank 0's parameters, everyone's small state.

`Collective` is one process on its own (every call is the identity), so the runner and
the algorithms run the same code single-process and distributed. `TorchCollective`
is torch.distributed: gloo on CPUs, NCCL on GPUs (tensors live where the backend
needs them; counts and flags are tiny and cross on the CPU with gloo).
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
    ) -> None:
        # Imported here: one process never pays for torch.distributed's import.
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.world_size = rank, world_size
        # The timeout bounds every collective: a rank that hangs makes the others
        # fail with an error instead of waiting forever.
        dist.init_process_group(
            backend,
            init_method=f"tcp://{address}:{port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )

    def sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        self.dist.all_reduce(tensor, op=self.dist.ReduceOp.SUM)
        return tensor

    def sum_counts(self, counts: Counter[str]) -> Counter[str]:
        keys = sorted(set().union(*self.gather_objects(sorted(counts))))
        values = torch.tensor([float(counts.get(key, 0.0)) for key in keys], dtype=torch.float64)
        self.sum_tensor(values)
        return Counter(dict(zip(keys, values.tolist(), strict=True)))

    def any(self, flag: bool) -> bool:
        value = torch.tensor([1.0 if flag else 0.0])
        self.dist.all_reduce(value, op=self.dist.ReduceOp.MAX)
        return bool(value.item())

    def broadcast_module(self, module: nn.Module) -> None:
        with torch.no_grad():
            for tensor in module.state_dict().values():
                self.dist.broadcast(tensor, src=0)

    def gather_objects(self, value: Any) -> list[Any]:
        gathered: list[Any] = [None] * self.world_size
        self.dist.all_gather_object(gathered, value)
        return gathered

    def close(self) -> None:
        if self.dist.is_initialized():
            self.dist.destroy_process_group()
