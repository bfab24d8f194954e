"""The validation error of cluster configs and component placements.

Every problem is a `trainer.key_paths.ConfigIssue` naming the rule it breaks, where it
sits (key path, and the component and placement segment when there is one) and, when the
input came from YAML text, its line. Checks collect issues and raise one
`ClusterConfigError` carrying all of them, so a user (or a web form) sees every mistake
at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from trainer.key_paths import ConfigIssue, KeyPath, with_lines

# The names the cluster's modules use for the shared types.
Path = KeyPath
__all__ = ["ClusterConfigError", "ConfigIssue", "IssueCollector", "Path", "with_lines"]


class ClusterConfigError(ValueError):
    """The one exception raised for an invalid cluster config or placement.

    `issues` holds every problem found (never empty); `to_list()` gives them as JSON-ready
    dicts for an API response.
    """

    def __init__(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        if not self.issues:
            raise ValueError("ClusterConfigError needs at least one issue")
        super().__init__(self._summary())

    @property
    def messages(self) -> list[str]:
        """Each issue with its line, location and rule, as the CLI and the admin show it."""
        return [_described(issue) for issue in self.issues]

    def to_list(self) -> list[dict[str, Any]]:
        return [issue.to_dict() for issue in self.issues]

    def _summary(self) -> str:
        count = len(self.issues)
        head = f"{count} problem{'s' if count != 1 else ''} in the cluster config:"
        return "\n".join([head, *(f"- {message}" for message in self.messages)])


def _described(issue: ConfigIssue) -> str:
    # Problems of the document as a whole (its YAML syntax) are the cluster's.
    if issue.path:
        return f"{issue} [{issue.rule}]"
    where = f"line {issue.line}: cluster" if issue.line is not None else "cluster"
    return f"{where}: {issue.message} [{issue.rule}]"


@dataclass
class IssueCollector:
    """Accumulates issues so validation can report all problems, not just the first."""

    issues: list[ConfigIssue] = field(default_factory=list)

    def add(
        self,
        rule: str,
        message: str,
        path: Path = (),
        *,
        component: str | None = None,
        segment: str | None = None,
    ) -> None:
        self.issues.append(ConfigIssue(rule, message, tuple(path), component, segment))

    def extend(self, issues: Iterable[ConfigIssue]) -> None:
        self.issues.extend(issues)

    def __bool__(self) -> bool:
        return bool(self.issues)

    def raise_if_any(self) -> None:
        if self.issues:
            raise ClusterConfigError(self.issues)
