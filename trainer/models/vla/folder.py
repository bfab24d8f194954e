"""A VLA's base model folder: what must be in it, loading it with the hub offline, and
the fingerprint a checkpoint keeps of it.

A run never downloads: the folder is a `save_pretrained` output (a model and its
processor) on the trainer's disk, and anything missing is named before torch loads a
byte.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

from trainer.models.vla.families import PI0, family_of
from trainer.models.vla.pi0 import load_pi0

# One of each group must be present.
REQUIRED_FILES: dict[str, tuple[str, ...]] = {
    "the model's config": ("config.json",),
    "the weights": ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"),
    "the processor's config": ("processor_config.json", "preprocessor_config.json"),
    "the tokenizer": ("tokenizer.json", "tokenizer.model"),
}


class ModelFolderError(ValueError):
    """The base model folder is missing or incomplete; the message says what lacks."""


def missing_parts(folder: Path) -> list[str]:
    """What a loadable model folder lacks, in words naming the files looked for."""
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    return [
        f"{what} ({' or '.join(names)})"
        for what, names in REQUIRED_FILES.items()
        if not any((folder / name).is_file() for name in names)
    ]


def check_folder(folder: Path) -> None:
    problems = missing_parts(folder)
    if problems:
        raise ModelFolderError(f"{folder} is not a complete model folder: no {', '.join(problems)}")


def load_folder(folder: Path) -> tuple[Any, Any]:
    """The model and its processor, from the folder alone: its family's classes (a π0
    through transformers' PI0 classes; any other image-text-to-text model through the
    Auto classes)."""
    check_folder(folder)
    # Offline for good: a config naming a hub repo must not reach out at run time.
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import AutoModelForImageTextToText, AutoProcessor
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()  # e.g. "torchvision is not installed": its PIL path is ours
    if family_of(folder) == PI0:
        return load_pi0(folder)
    processor = AutoProcessor.from_pretrained(folder, local_files_only=True)
    # sdpa whatever the folder's config asks: the policy passes its own attention
    # pattern as a 4D mask, which flash attention would not honour.
    model = AutoModelForImageTextToText.from_pretrained(
        folder, local_files_only=True, attn_implementation="sdpa"
    )
    return model, processor


def fingerprint(folder: Path) -> str:
    """SHA-256 over the folder's config and weight files (names and contents): what a
    checkpoint records of the base it was trained on."""
    digest = hashlib.sha256()
    groups = ("the model's config", "the weights")
    names = [name for group in groups for name in REQUIRED_FILES[group]]
    weight_shards = sorted(folder.glob("model-*.safetensors"))
    for path in [folder / name for name in names] + weight_shards:
        if not path.is_file():
            continue
        digest.update(path.name.encode())
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
