"""Structured validation errors for cluster configs and component placements.

Every problem becomes a `ConfigIssue` naming the rule it breaks, where it sits (key path,
and the component and placement segment when there is one) and, when the input came from
YAML text, its line. Checks collect issues and raise one `ClusterConfigError` carrying all
of them, so a user (or a web form) sees every mistake at once.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from trainer.key_paths import format_key_path

PathPart = str | int
Path = tuple[PathPart, ...]


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One validation problem.

    `rule` is a stable identifier (e.g. `placement.whole_multiple`) that callers may match
    on; `message` is the human explanation; `path` the key path into the `cluster:` section.
    """

    rule: str
    message: str
    path: Path = ()
    component: str | None = None
    segment: str | None = None
    line: int | None = None

    @property
    def location(self) -> str:
        return format_key_path(self.path)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rule": self.rule,
            "message": self.message,
            "path": list(self.path),
            "location": self.location,
            "component": self.component,
            "segment": self.segment,
            "line": self.line,
        }

    def __str__(self) -> str:
        where = self.location or "cluster"
        if self.line is not None:
            where = f"line {self.line}: {where}"
        return f"{where}: {self.message} [{self.rule}]"


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
        return [str(issue) for issue in self.issues]

    def to_list(self) -> list[dict[str, Any]]:
        return [issue.to_dict() for issue in self.issues]

    def _summary(self) -> str:
        count = len(self.issues)
        head = f"{count} problem{'s' if count != 1 else ''} in the cluster config:"
        return "\n".join([head, *(f"- {message}" for message in self.messages)])


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


def with_lines(issues: Iterable[ConfigIssue], lines: dict[Path, int]) -> list[ConfigIssue]:
    """Attach YAML line numbers: the line of the deepest known key on each issue's path."""
    located = []
    for issue in issues:
        line = None
        for end in range(len(issue.path), 0, -1):
            line = lines.get(issue.path[:end])
            if line is not None:
                break
        located.append(replace(issue, line=line) if line is not None else issue)
    return located
