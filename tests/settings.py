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

from controlplane.settings import *  # noqa: E402,F403

# Django's default hasher takes most of a second per password on purpose; tests that log
# in and fail repeatedly (the login rate limit) need no such cost.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

# Connections close after each request or socket message, as they did before they were
# kept: a kept one would stop the test database from being dropped at the end.
DATABASES["default"]["CONN_MAX_AGE"] = 0  # noqa: F405
