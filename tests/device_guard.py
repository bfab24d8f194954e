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
        frame = sys._getframe(2)
        while frame is not None and frame.f_code.co_filename.endswith(PASSING):
            frame = frame.f_back
        if frame is None:
            return None
        name = frame.f_code.co_filename
        if not any(name.startswith(root) for root in self.roots):
            return None
        if any(name.startswith(path) for path in self.exempt):
            return None
        return f"{Path(name).relative_to(REPO)}:{frame.f_lineno} in {frame.f_code.co_name}"
