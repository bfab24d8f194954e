"""Every process of a placed run that writes or reads the run's folder (actor ranks, the
RLPD learner) must see the folder the driver sees: checkpoints written on another
node's own disk are lost to the run page, the API and resume. Checked at start: the
driver writes a marker, each such process reads it back where it runs."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from trainer.runtime.ray_calls import answer

MARKER_PREFIX = ".shared-folder-check-"


class UnsharedRunFolder(RuntimeError):
    """A placed process does not see the run's folder."""


def reads_back(path: str, token: str) -> bool:
    """Run in a placed process: whether `path` holds `token` there."""
    try:
        return Path(path).read_text() == token
    except OSError:
        return False


def check_shared_folder(folder: Path, processes: list[tuple[str, Any]]) -> None:
    """`processes`: (what it is, its actor handle with a `sees(path, token)` method).
    Raises UnsharedRunFolder naming every process that does not see `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    marker = folder / f"{MARKER_PREFIX}{token[:8]}"
    marker.write_text(token)
    try:
        seen = answer(
            [handle.sees.remote(str(marker), token) for _, handle in processes],
            who="a process of the run", doing="checking the run folder",
            error=UnsharedRunFolder, timeout_s=60,
        )  # fmt: skip
    finally:
        marker.unlink(missing_ok=True)
    blind = [what for (what, _), sees in zip(processes, seen, strict=True) if not sees]
    if blind:
        raise UnsharedRunFolder(
            f"{', '.join(blind)} cannot see the run folder {folder.resolve()} (a file the "
            "driver wrote there is not there for them): the run folder must be on storage "
            "every node mounts at the same path (the control plane's ARTIFACTS_DIR; "
            "docs/training.md, 'The run folder on several nodes')"
        )
