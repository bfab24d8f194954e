"""Small helpers that read settings from environment variables.

Every setting has a working default for the one-machine mode; deploy/ENVIRONMENT.md
lists them all.
"""

import os
import secrets
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
    signed tokens) without asking a newcomer to invent one.
    """
    if path.exists():
        return path.read_text().strip()
    path.parent.mkdir(parents=True, exist_ok=True)
    secret = secrets.token_urlsafe(50)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process created it first: use theirs
        return path.read_text().strip()
    with os.fdopen(fd, "w") as handle:
        handle.write(secret)
    return secret
