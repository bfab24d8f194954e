"""Config errors that name the key path of every problem, e.g.
``rollout.action_horizons_pattern[1]: must be a multiple of actor.model.num_action_chunks``.

A problem is a `trainer.key_paths.ConfigIssue`, the type the cluster section's problems
have too, so a cluster problem passes into a config error as it is (rule and line kept).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer.key_paths import ConfigIssue, KeyPath, parse_key_path

__all__ = ["ConfigError", "ConfigIssue"]

# The rule of a problem raised without a more precise one.
GENERIC_RULE = "config.invalid"


class ConfigError(ValueError):
    """All problems of one config at once, so a user fixes them in one go."""

    def __init__(self, problems: Sequence[ConfigIssue]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))

    @classmethod
    def single(cls, path: str | KeyPath, message: str, *, rule: str = GENERIC_RULE) -> ConfigError:
        """One problem at `path`, a key path or its text (``env.task_ids[1]``)."""
        parts = parse_key_path(path) if isinstance(path, str) else tuple(path)
        return cls([ConfigIssue(rule, message, parts)])
