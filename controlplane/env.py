"""Small helpers that read settings from environment variables.

Every setting has a working default for the one-machine mode; deploy/ENVIRONMENT.md
lists them all.
"""

import os
import secrets
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

TRUE_WORDS = {"1", "true", "yes", "on"}
FALSE_WORDS = {"0", "false", "no", "off", ""}


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool = False) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in TRUE_WORDS:
        return True
    if value in FALSE_WORDS:
        return False
    raise ValueError(f"{name}={raw!r} is not a boolean (use one of 1/0, true/false, yes/no)")


def env_int(name: str, default: int = 0) -> int:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not a whole number") from None


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


def artifacts_dir(value: str, default: Path) -> Path:
    """ARTIFACTS_DIR as a folder: a plain path or a file:// URI (other schemes need the
    store mounted as a file system, since trainers and the web server read files)."""
    if not value:
        return default
    parsed = urlparse(value)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    if parsed.scheme:
        raise ValueError(
            f"ARTIFACTS_DIR={value!r}: use a path or a file:// URI; mount an object store "
            "(e.g. with s3fs or gcsfuse) and give its mount point"
        )
    return Path(value)


def persistent_secret(path: Path) -> str:
    """Return the secret stored at `path`, creating it on first use.

    The one-machine mode needs a stable SECRET_KEY across restarts (sessions,
    signed tokens) without asking a newcomer to invent one. The file is written whole
    under a temporary name (mode 0600) and only then put in place, so a start killed
    mid-write never leaves an empty secret behind; one found empty all the same is
    replaced, since an empty Ray token would start the head with its checks off.
    """
    found = _stored(path)
    if found:
        return found
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, draft = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(50))
        try:
            os.link(draft, path)  # in place only if no other process got there first
        except FileExistsError:
            if not _stored(path):  # the empty leftover of an interrupted start
                os.replace(draft, path)
    finally:
        Path(draft).unlink(missing_ok=True)
    return _stored(path)


def _stored(path: Path) -> str:
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        return ""
