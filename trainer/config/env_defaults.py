"""Per-env defaults the config schema fills in, kept free of heavy imports so the
control plane can validate configs without torch or LIBERO."""

from __future__ import annotations

BUILTIN_MAX_EPISODE_STEPS = 40

# The step limits LIBERO users evaluate with (OpenVLA, RLinf), counted after the no-op
# settle steps. They sit a little above the longest demonstration of each suite.
LIBERO_SUITE_MAX_STEPS = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
LIBERO_DEFAULT_SUITE = "libero_spatial"


def default_max_episode_steps(env_name: str, suite: str | None) -> int:
    """The time limit an env family uses when the config does not set one."""
    if env_name == "libero":
        return LIBERO_SUITE_MAX_STEPS.get(suite or LIBERO_DEFAULT_SUITE, 400)
    return BUILTIN_MAX_EPISODE_STEPS


# What an env family offers to evaluate, known without building the env: the control
# plane checks an evaluation's task ids and init-state count with these (tests keep them
# equal to the envs' own). None for an env registered elsewhere: the trainer checks it.
BUILTIN_TASK_COUNT = 6  # trainer.envs.builtin_reach.TASK_NAMES
LIBERO_SUITE_TASKS = {
    "libero_spatial": 10,
    "libero_object": 10,
    "libero_goal": 10,
    "libero_10": 10,
    "libero_90": 90,
}
LIBERO_INIT_STATES_PER_TASK = 50  # fixed files shipped with each task


def env_task_count(env_name: str, suite: str | None) -> int | None:
    """How many tasks (ids 0..N-1) the env has, or None when only the env knows."""
    if env_name == "builtin_reach":
        return BUILTIN_TASK_COUNT
    if env_name == "libero":
        return LIBERO_SUITE_TASKS.get(suite or LIBERO_DEFAULT_SUITE)
    return None


def env_init_states_per_task(env_name: str, init_states_per_task: int) -> int | None:
    """How many fixed init states each task has (`init_states_per_task` is the config's
    value, which the built-in env uses), or None when only the env knows."""
    if env_name == "builtin_reach":
        return init_states_per_task
    if env_name == "libero":
        return LIBERO_INIT_STATES_PER_TASK
    return None
