"""Settings for the test suite: the project's own, with a var/ folder of its own so a
running `./armature up` and the tests never share a database, broker or secrets."""

import os
from pathlib import Path

os.environ.setdefault(
    "ARMATURE_VAR_DIR", str(Path(__file__).resolve().parent.parent / "var" / "test")
)

from controlplane.settings import *  # noqa: E402,F403
