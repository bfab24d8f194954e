"""How a config error names where it is: ``("rollout", "action_horizons_pattern", 1)``
is ``rollout.action_horizons_pattern[1]``. One spelling for the experiment config
(trainer.config) and the cluster section (trainer.cluster) alike."""

from __future__ import annotations

from collections.abc import Sequence


def format_key_path(parts: Sequence[str | int]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
