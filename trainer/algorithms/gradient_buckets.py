"""Gradients summed across actor ranks while backward is still running, as DDP does it.

The parameters are grouped into buckets of about `cap_bytes` each, in reverse order of
registration (roughly the order backward produces their gradients). Each parameter's
post-accumulate hook copies its gradient into its bucket's flat buffer; once a bucket
holds all of its gradients its all-reduce starts, asynchronously, so the last layers'
sums travel while backward still works on the first ones. Buckets start strictly in
order, so every rank issues the same all-reduces in the same order even if a gradient
arrives late on one of them. `finish` starts what is left, waits, and writes the sums
back into each parameter's `.grad`.

The caller scales its loss so that summing is what it wants (the on-policy update
weighs each rank by its share of all ranks' rows).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from trainer.algorithms.collective import Collective

DEFAULT_CAP_BYTES = 25 * 2**20  # DDP's default bucket size


@dataclass
class _Bucket:
    params: list[torch.Tensor]
    offsets: list[int]
    buffer: torch.Tensor
    filled: int = 0
    work: Any = None  # the all-reduce in flight, once started


@dataclass
class GradientBuckets:
    """Hooks on `params` that sum their gradients over `collective` during backward.

    Use: `arm()` before `loss.backward()`, `finish()` after it."""

    params: list[torch.Tensor]
    collective: Collective
    cap_bytes: int = DEFAULT_CAP_BYTES
    buckets: list[_Bucket] = field(init=False, default_factory=list)
    launched: int = field(init=False, default=0)  # buckets started so far, in order
    armed: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        self.params = [p for p in self.params if p.requires_grad]
        self._slot: dict[int, tuple[_Bucket, int]] = {}
        for group in _groups(reversed(self.params), self.cap_bytes):
            offsets, size = [], 0
            for param in group:
                offsets.append(size)
                size += param.numel()
            first = group[0]
            bucket = _Bucket(
                group, offsets, torch.zeros(size, dtype=first.dtype, device=first.device)
            )
            self.buckets.append(bucket)
            for param, offset in zip(group, offsets, strict=True):
                self._slot[id(param)] = (bucket, offset)
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in self.params]

    def arm(self) -> None:
        """Take the gradients of the next backward."""
        for bucket in self.buckets:
            bucket.buffer.zero_()
            bucket.filled, bucket.work = 0, None
        self.launched, self.armed = 0, True

    def finish(self) -> None:
        """Start the buckets still waiting (a parameter that got no gradient adds zeros),
        wait for every sum and give each parameter its summed gradient."""
        if not self.armed:
            return
        self._launch_ready(everything=True)
        for bucket in self.buckets:
            bucket.work.wait()
            for param, offset in zip(bucket.params, bucket.offsets, strict=True):
                summed = bucket.buffer[offset : offset + param.numel()].view_as(param)
                if param.grad is None:
                    param.grad = summed.clone()
                else:
                    param.grad.copy_(summed)
        self.armed = False

    def remove(self) -> None:
        for hook in self._hooks:
            hook.remove()

    def _ready(self, param: torch.Tensor) -> None:
        if not self.armed:
            return
        bucket, offset = self._slot[id(param)]
        bucket.buffer[offset : offset + param.numel()].copy_(param.grad.reshape(-1))
        bucket.filled += 1
        self._launch_ready()

    def _launch_ready(self, everything: bool = False) -> None:
        while self.launched < len(self.buckets):
            bucket = self.buckets[self.launched]
            if not everything and bucket.filled < len(bucket.params):
                return
            bucket.work = self.collective.sum_tensor_async(bucket.buffer)
            self.launched += 1


def _groups(params: Iterable[torch.Tensor], cap_bytes: int) -> list[list[torch.Tensor]]:
    """Consecutive parameters of one dtype and device, about `cap_bytes` per group."""
    groups: list[list[torch.Tensor]] = []
    size = 0
    for param in params:
        current = groups[-1] if groups else None
        fits = (
            current is not None
            and current[0].dtype == param.dtype
            and current[0].device == param.device
            and size + param.numel() * param.element_size() <= cap_bytes
        )
        if fits:
            current.append(param)
            size += param.numel() * param.element_size()
        else:
            groups.append([param])
            size = param.numel() * param.element_size()
    return groups
