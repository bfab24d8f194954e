"""Vectorised environments: the interface, the built-in fast env, LIBERO (an optional
install, imported only when built) and a registry."""

from trainer.envs.builtin_reach import TASK_NAMES, BuiltinReachEnv
from trainer.envs.libero_env import LiberoVectorEnv
from trainer.envs.libero_setup import LiberoNotInstalledError
from trainer.envs.registry import UnknownEnvError, env_names, make_vector_env, register_env
from trainer.envs.subproc_vector_env import SubprocVectorEnv
from trainer.envs.vector_env import EnvStep, EnvWorkerError, VectorEnv

__all__ = [
    "TASK_NAMES",
    "BuiltinReachEnv",
    "EnvStep",
    "EnvWorkerError",
    "LiberoNotInstalledError",
    "LiberoVectorEnv",
    "SubprocVectorEnv",
    "UnknownEnvError",
    "VectorEnv",
    "env_names",
    "make_vector_env",
    "register_env",
]
