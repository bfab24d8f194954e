"""Where each key of a YAML config is written, so a problem named by its key path
(``rollout.action_horizons_pattern[1]``) can also point at its line in the editor."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from trainer.bounded_yaml import load_bounded
from trainer.key_paths import ConfigIssue, KeyPath, line_of


def key_lines(text: str) -> dict[KeyPath, int]:
    """``{("a", "b", 1): line}`` (1-based) for every key and list item of `text`; empty
    when it is not YAML (its syntax error carries its own line)."""
    try:  # within the same limits as the config itself: the text may be hostile
        document = load_bounded(text, typ="rt")
    except YAMLError:
        return {}
    lines: dict[KeyPath, int] = {}
    _walk(document, (), lines, set())
    return lines


def _walk(node: Any, path: KeyPath, lines: dict[KeyPath, int], seen: set[int]) -> None:
    # An alias points at a node already walked: walking it again would make an
    # alias-heavy document cost exponential time.
    if id(node) in seen:
        return
    if isinstance(node, CommentedMap):
        seen.add(id(node))
        for key, value in node.items():
            child = (*path, str(key))
            lines[child] = node.lc.key(key)[0] + 1
            _walk(value, child, lines, seen)
    elif isinstance(node, CommentedSeq):
        seen.add(id(node))
        for index, value in enumerate(node):
            child = (*path, index)
            lines[child] = node.lc.item(index)[0] + 1
            _walk(value, child, lines, seen)


def problem_lines(problems: Sequence[ConfigIssue], text: str) -> list[int | None]:
    """The line of each problem of a config read from `text`."""
    lines = key_lines(text) if text else {}
    return [problem.line or line_of(problem.path, lines) for problem in problems]
