"""Settings for the test suite: the project's own, with a var/ folder of this test
session's own, so a running `./armature up` and other test sessions never share its
database, broker or secrets. Processes the tests start inherit the folder through
ARMATURE_VAR_DIR."""

import os
from pathlib import Path

os.environ.setdefault(
    "ARMATURE_VAR_DIR",
    str(Path(__file__).resolve().parent.parent / "var" / "test" / f"session-{os.getpid()}"),
)


def _per_xdist_worker(worker: str) -> None:
    """Under pytest-xdist each worker is a session of its own: its own var/ folder and
    its own Redis database (base − N for worker gwN: broker queues, channel layer and
    cache are never shared). pytest-django gives each its own test database. Processes
    the worker starts inherit what is set here (and may import this module again)."""
    if os.environ.get("ARMATURE_TEST_WORKER") == worker:
        return
    os.environ["ARMATURE_TEST_WORKER"] = worker
    os.environ["ARMATURE_VAR_DIR"] += f"-{worker}"
    if os.environ.get("REDIS_URL"):
        base, _, db = os.environ["REDIS_URL"].rstrip("/").rpartition("/")
        if not db.isdigit():
            base, db = os.environ["REDIS_URL"].rstrip("/"), "0"
        index = int(worker.removeprefix("gw"))
        number = int(db) - index if int(db) >= index else int(db) + index
        os.environ["REDIS_URL"] = f"{base}/{number}"


if os.environ.get("PYTEST_XDIST_WORKER"):
    _per_xdist_worker(os.environ["PYTEST_XDIST_WORKER"])

from controlplane.settings import *  # noqa: E402,F403

# Django's default hasher takes most of a second per password on purpose; tests that log
# in and fail repeatedly (the login rate limit) need no such cost.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Connections close after each request or socket message, as they did before they were
# kept: a kept one would stop the test database from being dropped at the end.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
