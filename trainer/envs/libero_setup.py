"""Finding and importing LIBERO, which is an optional install (``./armature install-libero``).

Nothing here imports LIBERO at module level: the default install does not have it, and
``import trainer`` must never pay for (or fail on) a 2 GB simulator stack. The import
happens in ``import_libero``, only when a LIBERO env is built.

Two environment variables must be right before LIBERO's first import:
- ``LIBERO_CONFIG_PATH``: without a ``config.yaml`` there, LIBERO's import calls
  ``input()``. The installer writes one to ``var/libero`` in the checkout, which is
  the default used here when the variable is unset.
- ``MUJOCO_GL``: robosuite picks its renderer at import; ``egl`` renders camera images
  without a display or GPU (Mesa). State-only envs never render.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

INSTALL_HINT = (
    "install it into the project's virtualenv with `./armature install-libero` "
    "(about a minute and 2 GB; see docs/training.md)"
)


class LiberoNotInstalledError(RuntimeError):
    """LIBERO was requested but is not installed (or not set up) in this Python."""


def default_config_dir() -> Path:
    """Where ``./armature install-libero`` writes LIBERO's ``config.yaml``: ``var/libero``
    in the checkout. (Not under ``ARMATURE_VAR_DIR``: that folder is per deployment or
    per test session, while the install belongs to the checkout's virtualenv.)"""
    return Path(__file__).resolve().parents[2] / "var" / "libero"


def libero_config_dir() -> Path:
    configured = os.environ.get("LIBERO_CONFIG_PATH")
    return Path(configured) if configured else default_config_dir()


def check_libero_installed() -> None:
    """Raise ``LiberoNotInstalledError`` with the install command unless LIBERO can be
    imported without prompting and without downloading anything."""
    missing = [
        name for name in ("libero", "robosuite", "bddl") if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise LiberoNotInstalledError(
            f"the LIBERO env needs {', '.join(missing)}, which is not installed: {INSTALL_HINT}"
        )
    config_file = libero_config_dir() / "config.yaml"
    if not config_file.is_file():
        raise LiberoNotInstalledError(
            f"LIBERO is installed but {config_file} is missing (without it LIBERO asks "
            f"questions at import): {INSTALL_HINT}, or point LIBERO_CONFIG_PATH at a folder "
            "with a config.yaml"
        )
    libero_spec = importlib.util.find_spec("libero")
    assert libero_spec is not None and libero_spec.submodule_search_locations
    assets = Path(libero_spec.submodule_search_locations[0]) / "libero" / "assets"
    if not (assets / "scenes").is_dir():
        # Without local assets LIBERO tries a Hugging Face download at env creation.
        raise LiberoNotInstalledError(f"LIBERO's assets are missing at {assets}: {INSTALL_HINT}")


@dataclass(frozen=True)
class LiberoModules:
    benchmark: ModuleType  # libero.libero.benchmark
    control_env: Any  # libero.libero.envs.env_wrapper.ControlEnv


def import_libero() -> LiberoModules:
    """Import LIBERO (once per process) with its config path and renderer set."""
    check_libero_installed()
    os.environ.setdefault("LIBERO_CONFIG_PATH", str(libero_config_dir()))
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero.libero import benchmark
    from libero.libero.envs.env_wrapper import ControlEnv

    return LiberoModules(benchmark=benchmark, control_env=ControlEnv)
