"""Config errors that name the key path of every problem, e.g.
``rollout.action_horizons_pattern[1]: must be a multiple of actor.model.num_action_chunks``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trainer.key_paths import format_key_path

__all__ = ["ConfigError", "ConfigProblem", "format_key_path"]


@dataclass(frozen=True)
class ConfigProblem:
    path: str
    message: str
    line: int | None = None  # where the YAML text has it, when known (syntax errors)

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class ConfigError(ValueError):
    """All problems of one config at once, so a user fixes them in one go."""

    def __init__(self, problems: Sequence[ConfigProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(problem) for problem in self.problems))

    @classmethod
    def single(cls, path: str, message: str) -> ConfigError:
        return cls([ConfigProblem(path, message)])
