"""Where a run's files live, and reading them back for the run page and the API.

Every run owns one folder, `<ARTIFACTS_DIR>/run-<id>/`, outside Ray's temporary copy of
the job's working directory: the trainer is told it explicitly (`--output-dir`), so two
runs never share it and a resumed or resubmitted run continues in it. When Ray spans
several nodes the folder must be on storage every node and the control plane can reach
(NFS, or an object store mounted as a file system).
"""

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from django.conf import settings

MAX_LISTED_FILES = 2000
# How the trainer names a checkpoint in a run's folder (trainer.runner.checkpoints).
CHECKPOINT_NAME = re.compile(r"^iter_(\d+)\.pt$")


class ArtifactNotFound(Exception):
    pass


@dataclass(frozen=True)
class ArtifactFile:
    path: str  # relative to the run's folder, with "/" separators
    size: int
    modified: datetime


def run_artifact_dir(run_id: int) -> Path:
    return Path(settings.ARTIFACTS_DIR) / f"run-{run_id}"


def list_artifacts(run_id: int) -> list[ArtifactFile]:
    """The run's files, checkpoints first, then by path (at most MAX_LISTED_FILES)."""
    root = run_artifact_dir(run_id)
    if not root.is_dir():
        return []
    files = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            stat = path.stat()
            files.append(
                ArtifactFile(
                    path.relative_to(root).as_posix(),
                    stat.st_size,
                    datetime.fromtimestamp(stat.st_mtime, tz=UTC),
                )
            )
            if len(files) >= MAX_LISTED_FILES:
                break
    return sorted(files, key=lambda f: (not f.path.startswith("checkpoints/"), f.path))


def artifact_path(run_id: int, relative: str) -> Path:
    """The file `relative` of the run's folder; ArtifactNotFound for anything else
    (missing, a folder, or a path that leads outside the folder)."""
    root = run_artifact_dir(run_id).resolve()
    candidate = (root / relative).resolve()
    if not candidate.is_relative_to(root) or not candidate.is_file():
        raise ArtifactNotFound(relative)
    return candidate


def checkpoint_path(run_id: int, iteration: int) -> Path:
    """Where the run's checkpoint of `iteration` is (or would be)."""
    return run_artifact_dir(run_id) / "checkpoints" / f"iter_{iteration:06d}.pt"


def checkpoints(run_id: int) -> dict[int, Path]:
    """The run's checkpoints by iteration, oldest first ({} before the first)."""
    folder = run_artifact_dir(run_id) / "checkpoints"
    if not folder.is_dir():
        return {}
    found = {
        int(match.group(1)): path
        for path in folder.iterdir()
        if (match := CHECKPOINT_NAME.match(path.name)) and path.is_file()
    }
    return dict(sorted(found.items()))
