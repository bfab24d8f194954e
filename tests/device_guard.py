"""A guard that catches tensors made off a component's device, on a machine without a GPU.

On the CPU every tensor is on the right device, so a mismatch cannot show by itself.
What would put a tensor on the wrong device on a GPU is a factory call (`torch.zeros`,
`torch.arange`, ...) that names no device: it allocates on the CPU whatever device the
code runs on. The guard records every such call made from the trainer's code (the envs
excepted: they step on the CPU by design), so a CPU test fails on a new CPU-only
allocation in the rollout or the update. Tensors made from others (`new_zeros`,
`zeros_like`) follow their source and are fine.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

import torch
from torch.overrides import TorchFunctionMode

REPO = Path(__file__).resolve().parents[1]
FACTORIES = {
    torch.zeros, torch.ones, torch.empty, torch.full, torch.arange, torch.tensor,
    torch.as_tensor, torch.randperm, torch.randint, torch.rand, torch.randn,
    torch.linspace, torch.eye,
}  # fmt: skip
# Frames between a factory call and this mode: torch's dispatch of the mode, and this file.
PASSING = ("torch/overrides.py", "torch/utils/_device.py", "device_guard.py")


class DeviceGuard(TorchFunctionMode):
    """Records factory calls without `device=` made from files under `roots` (and not
    under `exempt`), as ``file:line in function``."""

    def __init__(self, roots: list[Path] | None = None, exempt: list[Path] | None = None) -> None:
        super().__init__()
        self.roots = [str(p) for p in (roots or [REPO / "trainer"])]
        self.exempt = [str(p) for p in (exempt or [REPO / "trainer" / "envs"])]
        self.found: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in FACTORIES and "device" not in kwargs:
            caller = self._caller()
            if caller is not None:
                self.found.append(caller)
        return func(*args, **kwargs)

    def _caller(self) -> str | None:
        """The code that called the factory; None unless it is the trainer's (torch's
        own calls, e.g. an optimizer's first step making its state, are torch's)."""
        frame = _trainer_frame(self.roots, self.exempt)
        if frame is None:
            return None
        name = frame.f_code.co_filename
        return f"{Path(name).relative_to(REPO)}:{frame.f_lineno} in {frame.f_code.co_name}"


def _trainer_frame(roots: list[str], exempt: list[str]) -> FrameType | None:
    """The frame that called into torch, where it is code under `roots` and not under
    `exempt`; None for any other caller (torch's own calls are torch's)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.endswith(PASSING):
        frame = frame.f_back
    if frame is None:
        return None
    name = frame.f_code.co_filename
    if not any(name.startswith(root) for root in roots):
        return None
    return None if any(name.startswith(path) for path in exempt) else frame


# What reads a tensor's values into the host: on a GPU, each waits for every kernel
# queued before it (a sync), and in a loop per step each stalls the GPU's queue. So do
# ops whose output's size depends on the values (the host must learn it to allocate).
HOST_READS = {
    "item", "tolist", "numpy", "cpu", "__bool__", "__int__", "__float__", "__index__",
    "__format__", "nonzero", "argwhere", "masked_select", "unique", "unique_consecutive",
}  # fmt: skip


def _reads(func, args, kwargs) -> bool:
    name = getattr(func, "__name__", None)
    if name in HOST_READS:
        return True
    if name in ("__getitem__", "__setitem__") and len(args) > 1:  # a boolean mask's rows
        index = args[1] if isinstance(args[1], tuple) else (args[1],)
        return any(isinstance(part, torch.Tensor) and part.dtype == torch.bool for part in index)
    if name == "repeat_interleave":  # its output's size, unless told
        repeats = args[1] if len(args) > 1 else kwargs.get("repeats")
        return isinstance(repeats, torch.Tensor) and kwargs.get("output_size") is None
    return False


class HostReadGuard(DeviceGuard):
    """Records reads of tensor values into the host (`.item()`, `.tolist()`, `bool(t)`,
    `.cpu()`, a boolean mask's rows, ...) made by the trainer's code (the envs
    excepted), as (file, function): on a GPU each is a sync. Entered around the calls a
    loop makes every step, it says which of them would stall the GPU each step; on the
    CPU it sees the same reads. torch's own reads (an optimizer's on the CPU) are
    torch's, and not recorded."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str]] = []  # type: ignore[assignment]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if _reads(func, args, kwargs):
            frame = _trainer_frame(self.roots, self.exempt)
            if frame is not None:
                where = str(Path(frame.f_code.co_filename).relative_to(REPO))
                self.found.append((where, frame.f_code.co_name))
        return func(*args, **kwargs)

    def around(self, owner: object, method: str) -> None:
        """Watch every call of `owner.method` from now on."""
        watched = getattr(owner, method)

        def call(*args, **kwargs):
            with self:
                return watched(*args, **kwargs)

        setattr(owner, method, call)
