"""Local checkpoints: everything needed to continue a run bit-for-bit (models, optimizer,
sampler cursors, random generators), one file per saved iteration. Sharded models
(`actor.strategy: fsdp`) write their models and optimizer beside it, a folder of shards
per iteration that the file names."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

import torch

from trainer.checkpoint_errors import UnreadableCheckpoint

_NAME = re.compile(r"iter_(\d+)\.pt$")
# How torch names what a weights-only load refused.
_UNSUPPORTED = re.compile(r"[Uu]nsupported (?:global: )?GLOBAL (\S+)")


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


class NoCheckpoint(ValueError):
    pass


def load_checkpoint(path: Path) -> dict[str, Any]:
    """The state `save_checkpoint` wrote, read as tensors and plain data only: a run
    folder is written by a job and read by others (an evaluation, a run that starts
    from its policy), and unpickling anything else could run code it planted."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError) as error:
        text = str(error)
        named = _UNSUPPORTED.search(text)
        if named:
            raise UnreadableCheckpoint(
                f"{path} holds objects other than tensors and plain data ({named.group(1)}); "
                "loading them could run code, so it is refused"
            ) from None
        # torch's own words for a weights-only failure are advice to load it unsafely.
        reason = "" if isinstance(error, pickle.UnpicklingError) else f": {text.splitlines()[0]}"
        raise UnreadableCheckpoint(f"{path} is not a readable checkpoint{reason}") from None
    if not isinstance(state, dict):
        raise UnreadableCheckpoint(f"{path} is not a checkpoint (it holds no state dict)")
    algorithm = state.get("algorithm")
    if isinstance(algorithm, dict) and "shards" in algorithm:  # named beside the file
        name = algorithm["shards"]
        if not isinstance(name, str) or Path(name).name != name or name in ("", ".", ".."):
            raise UnreadableCheckpoint(f"{path} names its shards {name!r}, not a folder beside it")
        algorithm["shards"] = str(path.parent / name)
    return state


def find_checkpoint(where: Path) -> Path:
    """A checkpoint file as given, or the latest of a run folder or its checkpoints."""
    if where.is_file():
        return where
    for folder in (where, where / "checkpoints"):
        found = latest_checkpoint(folder) if folder.is_dir() else None
        if found is not None:
            return found
    raise NoCheckpoint(f"no checkpoint at {where} (a .pt file, a run folder or its checkpoints)")
