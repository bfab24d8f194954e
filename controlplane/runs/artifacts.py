"""Where a run's files live, and reading them back for the run page, the API and the
control plane's own use (the link spool).

Every run owns one folder, `<ARTIFACTS_DIR>/run-<id>/`, outside Ray's temporary copy of
the job's working directory: the trainer is told it explicitly (`--output-dir`), so two
runs never share it and a resumed or resubmitted run continues in it. When Ray spans
several nodes the folder must be on storage every node and the control plane can reach
(NFS, or an object store mounted as a file system).

Jobs write to that storage, so nothing in a run's folder is trusted to be what its name
says: reading goes one path component at a time from the real artifacts root, through
open directory descriptors, and never follows a symbolic link (the run folder itself, a
sub-folder or a file). A link a job made, to `/` or to another run's folder, is simply
not there for the control plane; swapping one in between a check and a read cannot
help, because there is no separate check.

Names are the job's choice too: one that is not text (bytes that do not decode, kept
as surrogates) or holds a control character (a newline breaks the run page's file
links) is neither listed nor served. Files go out as opaque downloads
(`download_response`), never as something a browser would render or run on the
control plane's origin.
"""

import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from django.conf import settings
from django.http import FileResponse

from controlplane.core.async_streams import async_chunks

MAX_LISTED_FILES = 2000
# How the trainer names a checkpoint in a run's folder (trainer.runner.checkpoints).
CHECKPOINT_NAME = re.compile(r"^iter_(\d+)\.pt$")
# Every descriptor opened below the root: no link followed, no waiting on a FIFO.
_NO_LINKS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_FOLDER = os.O_RDONLY | os.O_DIRECTORY | _NO_LINKS
# Characters no listed or served name holds: C0 controls, DEL, and the surrogates that
# stand for undecodable bytes in names read from the file system.
_UNLISTED = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")
# A served file is an attachment of no known type; its own policy forbids everything,
# should a browser render it anyway (the pages' policy, core/csp.py, keeps it).
DOWNLOAD_POLICY = "sandbox; default-src 'none'"
DOWNLOAD_CHUNK = 1 << 20


class ArtifactNotFound(Exception):
    pass


@dataclass(frozen=True)
class ArtifactFile:
    path: str  # relative to the run's folder, with "/" separators
    size: int
    modified: datetime


def run_artifact_dir(run_id: int) -> Path:
    """Where the run's folder is meant to be (for the trainer to write to)."""
    return Path(settings.ARTIFACTS_DIR) / f"run-{run_id}"


class RunFolderTaken(Exception):
    """A new run's folder was already there: someone else made it."""


def make_run_folder(run_id: int) -> Path:
    """Make the new run's folder, its user's alone (0700), failing if it exists: a
    folder made ahead of the run (run ids are sequential) with a checkpoint in it would
    otherwise be taken for the run's own by a resume or by a run started from it."""
    folder = run_artifact_dir(run_id)
    folder.parent.mkdir(parents=True, exist_ok=True)
    try:
        folder.mkdir(mode=0o700)
    except FileExistsError:
        raise RunFolderTaken(
            f"{folder} was already there before run {run_id} began: the control plane "
            "makes each run's folder itself, so something else put it there. Remove it "
            "(after a look at what it holds) and launch again."
        ) from None
    return folder


def allowed_roots() -> list[Path]:
    """The folders a run's config may name files in (trainer.config.path_roots)."""
    return [Path(settings.ARTIFACTS_DIR), Path(settings.ARMATURE_MODELS_DIR),
            Path(settings.ARMATURE_DATASETS_DIR)]  # fmt: skip


def artifacts_root() -> Path:
    """The real artifacts root: ARTIFACTS_DIR with its own links resolved (the admin's
    choice, e.g. a mount point), the one place containment is judged against."""
    return Path(settings.ARTIFACTS_DIR).resolve()


@contextmanager
def run_folder(run_id: int) -> Iterator[int]:
    """An open descriptor of the run's folder, the real folder `run-<id>` right under the
    real artifacts root; ArtifactNotFound when it is missing or is a link."""
    try:
        root = os.open(artifacts_root(), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        raise ArtifactNotFound(f"run-{run_id}") from None
    try:
        folder = open_beneath(root, f"run-{run_id}", _FOLDER)
    finally:
        os.close(root)
    try:
        yield folder
    finally:
        os.close(folder)


def open_beneath(folder: int, relative: str, flags: int = os.O_RDONLY) -> int:
    """A descriptor of `relative` (components separated by "/") under the open folder
    `folder`, opened with `flags`, following no link on the way or at the end;
    ArtifactNotFound for anything else: missing, a link, `..`, or a name the operating
    system refuses (a NUL byte, too long)."""
    *folders, name = relative.split("/")
    if any(part in ("", ".", "..") for part in [*folders, name]):
        raise ArtifactNotFound(relative)
    current = folder
    try:
        for part in folders:
            following = os.open(part, _FOLDER, dir_fd=current)
            if current != folder:
                os.close(current)
            current = following
        return os.open(name, flags | _NO_LINKS, dir_fd=current)
    except (OSError, ValueError):  # ValueError: an embedded NUL byte
        raise ArtifactNotFound(relative) from None
    finally:
        if current != folder:
            os.close(current)


def listable(name: str) -> bool:
    """Whether a name (or path) is one the run's files list and serve."""
    return _UNLISTED.search(name) is None


def open_artifact(run_id: int, relative: str) -> BinaryIO:
    """The regular file `relative` of the run's folder, open for reading; ArtifactNotFound
    for anything else (missing, a folder, a link, a path leading outside, or a name that
    is never listed)."""
    if not listable(relative):
        raise ArtifactNotFound(relative)
    with run_folder(run_id) as folder:
        descriptor = open_beneath(folder, relative)
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise ArtifactNotFound(relative)
    os.set_blocking(descriptor, True)
    return os.fdopen(descriptor, "rb")


def download_response(found: BinaryIO, relative: str) -> FileResponse:
    """The open file `found` (from open_artifact) as a download: octet-stream whatever
    its name says (no `x.js` a page of this origin could load as a script, no `x.html`
    or `x.svg` rendered), with a policy of its own."""
    response = FileResponse(
        found, as_attachment=True, filename=relative.rpartition("/")[2],
        content_type="application/octet-stream",
    )  # fmt: skip
    response.headers["Content-Security-Policy"] = DOWNLOAD_POLICY
    # Sent a chunk at a time (its headers, length included, are the file's): a
    # checkpoint of gigabytes costs the web server one chunk (core/async_streams.py).
    response.streaming_content = async_chunks(iter(lambda: found.read(DOWNLOAD_CHUNK), b""))
    return response


def list_artifacts(run_id: int) -> list[ArtifactFile]:
    """The run's regular files, checkpoints first, then by path (at most
    MAX_LISTED_FILES); links and what they lead to are left out, and so are names that
    are not `listable` (a folder of such a name is not entered)."""
    files = []
    try:
        with run_folder(run_id) as folder:
            # fwalk opens each sub-folder by descriptor and does not enter links.
            for top, folders, names, top_fd in os.fwalk(".", dir_fd=folder):
                folders[:] = [name for name in folders if listable(name)]
                for name in names:
                    if not listable(name):
                        continue
                    try:
                        info = os.stat(name, dir_fd=top_fd, follow_symlinks=False)
                    except OSError:  # gone meanwhile
                        continue
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    path = os.path.normpath(os.path.join(top, name))
                    modified = datetime.fromtimestamp(info.st_mtime, tz=UTC)
                    files.append(ArtifactFile(path, info.st_size, modified))
                    if len(files) >= MAX_LISTED_FILES:
                        break
                if len(files) >= MAX_LISTED_FILES:
                    break
    except ArtifactNotFound:
        return []
    return sorted(files, key=lambda f: (not f.path.startswith("checkpoints/"), f.path))


def checkpoint_path(run_id: int, iteration: int) -> Path:
    """Where the run's checkpoint of `iteration` is (or would be)."""
    return run_artifact_dir(run_id) / "checkpoints" / f"iter_{iteration:06d}.pt"


def checkpoints(run_id: int) -> dict[int, Path]:
    """The run's checkpoints by iteration, oldest first ({} before the first): regular
    files only, in the run's real folder."""
    try:
        with run_folder(run_id) as folder:
            listing = open_beneath(folder, "checkpoints", _FOLDER)
    except ArtifactNotFound:
        return {}
    found = {}
    where = run_artifact_dir(run_id) / "checkpoints"
    try:
        with os.scandir(listing) as entries:
            for entry in entries:
                match = CHECKPOINT_NAME.match(entry.name)
                if match and entry.is_file(follow_symlinks=False):
                    found[int(match.group(1))] = where / entry.name
    finally:
        os.close(listing)
    return dict(sorted(found.items()))
