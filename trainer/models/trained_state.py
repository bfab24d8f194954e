"""What a checkpoint keeps of a policy: its trained weights and its buffers, not the
frozen ones. A VLA with LoRA adapters or a frozen vision tower would otherwise copy its
whole base model into every checkpoint; the base stays in its folder, named by the
checkpoint (`base_model`) with its fingerprint, and is loaded from there again."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def trained_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """The module's state without its frozen parameters."""
    frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
    return {name: t for name, t in module.state_dict().items() if name not in frozen}


def load_trained_state(module: nn.Module, state: dict[str, Any]) -> None:
    """`state` from `trained_state` (or a whole state dict) into `module`: what it lacks
    must be the module's frozen parameters, which keep their loaded values."""
    frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
    missing, unexpected = module.load_state_dict(state, strict=False)
    lacking = [name for name in missing if name not in frozen]
    if lacking or unexpected:
        parts = []
        if lacking:
            parts.append(f"missing {', '.join(lacking[:5])}")
        if unexpected:
            parts.append(f"unexpected {', '.join(unexpected[:5])}")
        raise RuntimeError(f"the saved policy does not fit this model: {'; '.join(parts)}")


def policy_checkpoint(policy: nn.Module) -> dict[str, Any]:
    """A checkpoint's policy entries: `policy`, and `base_model` for a policy built on a
    base folder (a VLA's)."""
    entries: dict[str, Any] = {"policy": trained_state(policy)}
    base = getattr(policy, "base_model", None)
    if base is not None:
        entries["base_model"] = base()
    return entries


def load_policy_checkpoint(policy: nn.Module, entries: dict[str, Any]) -> None:
    """`policy_checkpoint`'s entries back into `policy`; a checkpoint trained on another
    base than the policy's folder holds is refused (ValueError)."""
    check_base = getattr(policy, "check_base_model", None)
    if check_base is not None:
        check_base(entries.get("base_model"))
    load_trained_state(policy, entries["policy"])
