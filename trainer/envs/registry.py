"""Build a vectorised env from its name, so configs stay plain data."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from trainer.envs.builtin_reach import BuiltinReachEnv
from trainer.envs.subproc_vector_env import SubprocVectorEnv
from trainer.envs.vector_env import VectorEnv

EnvFactory = Callable[..., VectorEnv]

_FACTORIES: dict[str, EnvFactory] = {"builtin_reach": BuiltinReachEnv}


def register_env(name: str, factory: EnvFactory) -> None:
    """Make ``env.name: NAME`` in a config build ``factory(num_envs=..., **options)``."""
    _FACTORIES[name] = factory


def env_names() -> list[str]:
    return sorted(_FACTORIES)


class UnknownEnvError(ValueError):
    pass


def make_vector_env(name: str, num_envs: int, num_workers: int = 0, **options: Any) -> VectorEnv:
    """``num_workers=0`` steps every copy in this process; ``N > 0`` splits the copies
    over N worker processes (for slow simulators; the factory must be importable there)."""
    if name not in _FACTORIES:
        raise UnknownEnvError(f"unknown env {name!r}; known envs: {', '.join(env_names())}")
    factory = _FACTORIES[name]
    if num_workers:
        return SubprocVectorEnv(partial(factory, **options), num_envs, num_workers)
    return factory(num_envs=num_envs, **options)
