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
