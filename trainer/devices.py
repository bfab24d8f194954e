"""Where a trainer process computes: the device a config key names, resolved against
what the process sees, the precision of its forward passes, and the one way
observations cross from the CPU envs to that device.

Envs always step on the CPU. A component that computes (an actor rank's policy and
critic, a rollout worker, RLPD's learner) keeps every tensor on its device; an
observation crosses once per step through a pinned staging buffer, and the env's
actions come back once per step. Placement decides which GPUs a process sees
(``CUDA_VISIBLE_DEVICES``, set by Ray for processes given GPUs); ``auto`` takes the
process's share of them by its local rank on the node.
"""

from __future__ import annotations

import contextlib
import os
import re
from typing import Any

import torch

from trainer.config.errors import ConfigError

DEVICE_SPEC = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def visible_gpus() -> str:
    """What this process sees, in words, for error messages."""
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    seen = f"{count} GPU(s)"
    if visible is not None:
        seen += f" (CUDA_VISIBLE_DEVICES={visible!r})"
    return seen


def resolve_device(spec: str, key: str = "actor.device", local_rank: int = 0) -> torch.device:
    """The device `spec` names for this process: ``auto`` is the GPU of this process's
    local rank among those it sees (wrapping), or the CPU where it sees none; ``cuda``
    is that same GPU, required; ``cuda:N`` the N-th GPU it sees. A device the process
    does not have is a config error naming `key` and what the process sees."""
    if not DEVICE_SPEC.match(spec):
        raise ConfigError.single(key, f"{spec!r} is not a device: use auto, cpu, cuda or cuda:N")
    if spec == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if spec == "auto":
        return torch.device("cuda", local_rank % count) if count else torch.device("cpu")
    index = int(spec.split(":")[1]) if ":" in spec else local_rank % max(count, 1)
    if index >= count:
        raise ConfigError.single(key, f"{spec} is not there: this process sees {visible_gpus()}")
    return torch.device("cuda", index)


def local_rank() -> int:
    """This process's rank among its node's processes of the same group, as launchers
    set it (``LOCAL_RANK``); 0 for a process on its own."""
    try:
        return int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        return 0


def enable_fast_matmul(device: torch.device) -> None:
    """TF32 for float32 matmuls and convolutions on Ampere and later GPUs: ~8x the
    throughput at 10 mantissa bits, which policy-gradient updates do not notice."""
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def autocast(
    device: torch.device, precision: str, cache: bool = True
) -> contextlib.AbstractContextManager:
    """The forward passes' precision: ``bf16`` runs them under autocast (weights and
    optimizer state stay float32); ``fp32`` changes nothing. `cache` False for code a
    CUDA graph captures: autocast's cache of cast weights cannot live in a graph."""
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)


def to_device_async(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device` without the host waiting. A plain copy from the CPU to a GPU
    waits for everything queued on the GPU before it (a sync); this one crosses from
    pinned memory (torch's caching host allocator keeps the block until the copy has
    run), so the host goes on queueing work. For tensors of any shape, made once:
    `HostToDevice` is the cheaper way for the same shapes every step."""
    if device.type != "cuda" or tensor.device.type != "cpu":
        return tensor.to(device)
    return tensor.pin_memory().to(device, non_blocking=True)


class HostToDevice:
    """Copies CPU tensors to `device` through pinned staging buffers, one per name (and
    shape), so the copy runs asynchronously (``non_blocking``) without pinning a fresh
    buffer per step. A buffer is reused by the next call of its name: by then the
    previous copy has finished, because the caller waited for the step's actions to
    come back from the device (a synchronous copy) in between."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned = device.type == "cuda"
        self._staging: dict[tuple, torch.Tensor] = {}

    def __call__(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        if tensor.device == self.device:
            return tensor
        if not self._pinned or tensor.device.type != "cpu":
            return tensor.to(self.device)
        staging = self._buffer(name, tensor.shape, tensor.dtype)
        staging.copy_(tensor)
        return staging.to(self.device, non_blocking=True)

    def stack(self, name: str, rows: tuple[torch.Tensor, ...]) -> torch.Tensor:
        """CPU tensors of one shape (any dtypes) as the rows of one float32 tensor on the
        device: stacked straight into the staging buffer, then one copy."""
        if not self._pinned:
            return torch.stack(rows).to(self.device, torch.float32)
        staging = self._buffer(name, (len(rows), *rows[0].shape), torch.float32)
        torch.stack(rows, out=staging)
        return staging.to(self.device, non_blocking=True)

    def _buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        # By shape too: a pipelined round's stages of different sizes alternate, and
        # pinning a buffer anew costs more than the copy.
        key = (name, tuple(shape), dtype)
        staging = self._staging.get(key)
        if staging is None:
            staging = torch.empty(shape, dtype=dtype, device="cpu", pin_memory=True)
            self._staging[key] = staging
        return staging


def gpu_rng_state(device: torch.device) -> dict[str, Any]:
    """The GPU's random generator where a process computes on one (sampling noise is
    drawn there), for its checkpoint beside the CPU's."""
    return {"cuda_rng": torch.cuda.get_rng_state(device)} if device.type == "cuda" else {}


def load_gpu_rng_state(state: dict[str, Any], device: torch.device) -> None:
    """Put back what `gpu_rng_state` saved. A checkpoint from a GPU resumed on the CPU
    (or the reverse) restores the generator both have; the GPU's starts from the seed."""
    if device.type == "cuda" and "cuda_rng" in state:
        torch.cuda.set_rng_state(state["cuda_rng"], device)


def describe_device(device: torch.device) -> str:
    """What the run page shows a process computes on: ``cpu``, or the GPU's index as the
    process sees it and its name (``cuda:0 NVIDIA H100 80GB HBM3``)."""
    if device.type != "cuda":
        return str(device)
    return f"{device} {torch.cuda.get_device_name(device)}"


def device_metrics(device: torch.device) -> dict[str, float]:
    """The process's GPU memory this iteration (GiB allocated now, reserved by torch's
    caching allocator, and the peak since the last call) and the GPU's utilisation (%,
    where NVML is installed); nothing on the CPU."""
    if device.type != "cuda":
        return {}
    gib = 2.0**30
    metrics = {
        "device/memory_allocated_gb": torch.cuda.memory_allocated(device) / gib,
        "device/memory_reserved_gb": torch.cuda.memory_reserved(device) / gib,
        "device/memory_peak_gb": torch.cuda.max_memory_allocated(device) / gib,
    }
    torch.cuda.reset_peak_memory_stats(device)
    try:
        metrics["device/utilization"] = float(torch.cuda.utilization(device))
    except (ModuleNotFoundError, RuntimeError):  # no NVML bindings, or NVML refused
        pass
    return metrics


def per_process_metrics(processes: dict[str, dict[str, float]]) -> dict[str, float]:
    """Several processes' `device_metrics`, each under its process's name
    (``device/actor-1/memory_allocated_gb``): what a run of several computing processes
    charts, one line per process."""
    return {
        f"device/{process}/{key.removeprefix('device/')}": value
        for process, metrics in processes.items()
        for key, value in metrics.items()
    }
