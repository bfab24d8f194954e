"""VLA families: which one a model folder holds, by its `config.json`'s `model_type`.

- ``pi0``: a flow-matching VLA (transformers' PI0 classes, `trainer.models.vla.pi0`).
- ``tokens``: any other image-text-to-text model, given a discrete action-token head
  (`trainer.models.vla.policy`).

A new family (π0.5, SmolVLA, GR00T when transformers ships them) is a module with its
loader and tiny builder, and a line here.
"""

from __future__ import annotations

import json
from pathlib import Path

PI0 = "pi0"
TOKENS = "tokens"
FAMILIES = (PI0, TOKENS)


def family_of(folder: Path) -> str:
    """The family of a model folder (one with a readable `config.json`)."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return TOKENS  # the folder checks name what is missing or unreadable
    return PI0 if isinstance(config, dict) and config.get("model_type") == PI0 else TOKENS
