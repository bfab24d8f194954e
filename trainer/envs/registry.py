"""Build a vectorised env from its name, so configs stay plain data."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.libero_env import LiberoVectorEnv
from trainer.envs.libero_setup import check_libero_installed
from trainer.envs.subproc_vector_env import SubprocVectorEnv
from trainer.envs.vector_env import VectorEnv

EnvFactory = Callable[..., VectorEnv]


def _real_robot_env(**options: Any) -> VectorEnv:
    # Imported when built: requests and scipy load only where arms are driven.
    from trainer.envs.real_robot import RealRobotEnv

    return RealRobotEnv(**options)


# Runs in the trainer's process before any worker starts, so a missing optional
# dependency is one clear error instead of a traceback from every worker.
RequirementCheck = Callable[[], None]

_FACTORIES: dict[str, EnvFactory] = {
    "builtin_reach": BuiltinReachEnv,
    # The module imports LIBERO only when an env is built: it stays optional.
    "libero": LiberoVectorEnv,
    # Arms behind SERL robot servers (HIL-SERL's franka_server.py).
    "real_robot": _real_robot_env,
}
_CHECKS: dict[str, RequirementCheck] = {"libero": check_libero_installed}


def register_env(name: str, factory: EnvFactory, check: RequirementCheck | None = None) -> None:
    """Make ``env.name: NAME`` in a config build ``factory(num_envs=..., **options)``;
    ``check`` raises when the env's optional dependencies are missing."""
    _FACTORIES[name] = factory
    if check is not None:
        _CHECKS[name] = check
    else:
        _CHECKS.pop(name, None)


def env_names() -> list[str]:
    return sorted(_FACTORIES)


class UnknownEnvError(ValueError):
    pass


def make_vector_env(name: str, num_envs: int, num_workers: int = 0, **options: Any) -> VectorEnv:
    """``num_workers=0`` steps every copy in this process; ``N > 0`` splits the copies
    over N worker processes (for slow simulators; the factory must be importable there)."""
    if name not in _FACTORIES:
        raise UnknownEnvError(f"unknown env {name!r}; known envs: {', '.join(env_names())}")
    if name in _CHECKS:
        _CHECKS[name]()
    factory = _FACTORIES[name]
    if num_workers:
        return SubprocVectorEnv(partial(factory, **options), num_envs, num_workers)
    return factory(num_envs=num_envs, **options)
