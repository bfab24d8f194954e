"""Local checkpoints: everything needed to continue a run bit-for-bit (models, optimizer,
sampler cursors, random generators), one file per saved iteration. Sharded models
(`actor.strategy: fsdp`) write their models and optimizer beside it, a folder of shards
per iteration that the file names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"iter_(\d+)\.pt$")


def checkpoint_path(directory: Path, iteration: int) -> Path:
    return directory / f"iter_{iteration:06d}.pt"


def shards_path(directory: Path, iteration: int) -> Path:
    """The folder of an iteration's model and optimizer shards (sharded runs only)."""
    return directory / f"iter_{iteration:06d}.shards"


def save_checkpoint(directory: Path, iteration: int, state: dict[str, Any]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(directory, iteration)
    partial = path.with_suffix(".pt.partial")
    torch.save(state, partial)
    partial.replace(path)  # a crash mid-write never leaves a truncated checkpoint
    return path


def latest_checkpoint(directory: Path) -> Path | None:
    found = [
        (int(match.group(1)), path)
        for path in directory.glob("iter_*.pt")
        if (match := _NAME.search(path.name))
    ]
    return max(found)[1] if found else None


def load_checkpoint(path: Path) -> dict[str, Any]:
    # weights_only=False: the state holds RNG states and plain dicts we wrote ourselves.
    state = torch.load(path, map_location="cpu", weights_only=False)
    algorithm = state.get("algorithm")
    if isinstance(algorithm, dict) and "shards" in algorithm:  # named beside the file
        algorithm["shards"] = str(path.parent / algorithm["shards"])
    return state


class NoCheckpoint(ValueError):
    pass


def find_checkpoint(where: Path) -> Path:
    """A checkpoint file as given, or the latest of a run folder or its checkpoints."""
    if where.is_file():
        return where
    for folder in (where, where / "checkpoints"):
        found = latest_checkpoint(folder) if folder.is_dir() else None
        if found is not None:
            return found
    raise NoCheckpoint(f"no checkpoint at {where} (a .pt file, a run folder or its checkpoints)")
