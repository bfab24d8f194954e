"""Where a config problem is, and the problem itself.

A key path names a place in a config: ``("rollout", "action_horizons_pattern", 1)`` is
``rollout.action_horizons_pattern[1]``. Every problem of the experiment config
(trainer.config) and of the cluster section (trainer.cluster) alike is a `ConfigIssue`:
the rule it breaks, its message, its key path and, when the config came from YAML text,
its line. One spelling and one type, so the CLI, the API and the pages show both the
same way.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

PathPart = str | int
KeyPath = tuple[PathPart, ...]

# One part of a key path as `format_key_path` writes it: a key, or a list index.
_PART = re.compile(r"\[(\d+)\]|\.?([^.\[]+)")


def format_key_path(parts: Sequence[PathPart]) -> str:
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text


def parse_key_path(text: str) -> KeyPath:
    """The parts of a key path written as text (the inverse of `format_key_path`). Text
    that does not read back as written (``--tasks``, an override typed wrongly) stays
    one part, so a message names exactly what the user wrote."""
    parts: list[PathPart] = []
    for match in _PART.finditer(text):
        index, key = match.groups()
        parts.append(int(index) if index is not None else key)
    path = tuple(parts)
    return path if format_key_path(path) == text else ((text,) if text else ())


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem of a config.

    `rule` is a stable identifier (``placement.whole_multiple``, ``config.unknown_key``)
    that callers may match on; `message` the human explanation; `path` the key path from
    the config's root; `line` the YAML line, when known. A placement problem also names
    its component and the segment of its placement string.
    """

    rule: str
    message: str
    path: KeyPath = ()
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
        where = f"line {self.line}: " if self.line is not None else ""
        if self.path:
            where += f"{self.location}: "
        return where + self.message


def line_of(path: KeyPath, lines: Mapping[KeyPath, int]) -> int | None:
    """The line of `path`, else of its nearest written ancestor (a missing key is
    reported where its parent is)."""
    for end in range(len(path), 0, -1):
        line = lines.get(path[:end])
        if line is not None:
            return line
    return None


def with_lines(issues: Iterable[ConfigIssue], lines: Mapping[KeyPath, int]) -> list[ConfigIssue]:
    """`issues`, each with the line of its key path where it has none yet."""
    located = []
    for issue in issues:
        line = issue.line if issue.line is not None else line_of(issue.path, lines)
        located.append(replace(issue, line=line) if line != issue.line else issue)
    return located
