"""Reading `cluster.component_placement` into rules, before any cluster is consulted.

Two forms, freely mixed:

    actor,inference: 0-7                      # short form: the whole cluster's accelerators
    env: {node_group: franka, placement: 0-1}  # node-group form
    agent: {node_group: "a800,4090", placement: 0-15}   # several groups, numbered in order
    sim: {node_group: node, placement: 0-1, hide_accelerators: true}   # see no accelerator
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigIssue, Path
from .grammar import Segment, parse_placement_string

_COMPONENT_NAME = re.compile(r"[A-Za-z0-9_.\-]+", re.ASCII)
_RULE_KEYS = ("node_group", "placement", "hide_accelerators")
_SEGMENT_LIKE = re.compile(r"(?:[0-9:\- ]|all)+")


@dataclass(frozen=True, slots=True)
class ComponentRule:
    """One entry of `component_placement`: components sharing one placement string."""

    components: tuple[str, ...]
    node_groups: tuple[str, ...] | None  # None: the short form (the implicit `cluster` group)
    text: str
    segments: tuple[Segment, ...]
    path: Path
    # Processes not placed on accelerators see all of their node's accelerators (simulators
    # and robot drivers may render on them) unless this is set; accelerator-placed
    # processes always see only their own.
    hide_accelerators: bool = False


def normalize_placement_value(value: object) -> object:
    """Canonical stored form of one entry: strings for ranks and labels, as written, except
    that a YAML list of node group labels becomes the comma-separated text it means
    (`[robot, gpu]` is `"robot,gpu"`), so both spellings give the same cluster."""
    if isinstance(value, Mapping):
        normalized: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, list | tuple):
                items = [_scalar_text(label) for label in item]
                if key == "node_group" and items and all(isinstance(i, str) for i in items):
                    normalized[str(key)] = ",".join(label.strip() for label in items)
                else:
                    normalized[str(key)] = items
            else:
                normalized[str(key)] = _scalar_text(item)
        return normalized
    return _scalar_text(value)


def _scalar_text(value: object) -> object:
    # Integers are unambiguous (`placement: 7`, `node_group: 4090`); anything else stays as
    # is so the parser can reject it with a precise message.
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def parse_component_placement(
    raw: object, path: Path = ("cluster", "component_placement")
) -> tuple[list[ComponentRule], list[ConfigIssue]]:
    """Parse the mapping into rules; every structural or syntax problem becomes an issue."""
    rules: list[ComponentRule] = []
    issues: list[ConfigIssue] = []
    if not isinstance(raw, Mapping):
        issues.append(
            ConfigIssue(
                "placement.type",
                "component_placement must be a mapping of component names to placements, "
                f"e.g. 'actor: 0-7'; got {type(raw).__name__}",
                path,
            )
        )
        return rules, issues
    if not raw:
        issues.append(
            ConfigIssue("placement.empty", "component_placement names no component", path)
        )
    seen: dict[str, str] = {}
    for key, value in raw.items():
        key_text = str(key)
        entry_path = (*path, key_text)
        names = [name.strip() for name in key_text.split(",")]
        valid_names = True
        for name in names:
            if not _COMPONENT_NAME.fullmatch(name):
                valid_names = False
                issues.append(
                    ConfigIssue(
                        "placement.component_name",
                        f"'{key_text}': component name '{name}' is invalid; use letters, "
                        "digits, '_', '.' or '-', and separate several names with commas",
                        entry_path,
                        component=name or None,
                    )
                )
            elif name in seen:
                valid_names = False
                issues.append(
                    ConfigIssue(
                        "placement.duplicate_component",
                        f"component '{name}' is placed twice (in '{seen[name]}' and "
                        f"'{key_text}'); each component needs exactly one placement",
                        entry_path,
                        component=name,
                    )
                )
            else:
                seen[name] = key_text
        component = names[0] if len(names) == 1 else key_text
        rule = _parse_rule(tuple(names), component, value, entry_path, issues)
        if rule is not None and valid_names:
            rules.append(rule)
    return rules, issues


def _parse_rule(
    names: tuple[str, ...],
    component: str,
    value: object,
    path: Path,
    issues: list[ConfigIssue],
) -> ComponentRule | None:
    value = normalize_placement_value(value)
    node_groups: tuple[str, ...] | None = None
    hide = False
    text_path = path
    if isinstance(value, Mapping):
        for key in value:
            if key not in _RULE_KEYS:
                # `{placement: 0-1,2-3}` in YAML flow style splits at the comma.
                hint = (
                    "; in a {...} mapping, quote a placement that contains commas"
                    if _SEGMENT_LIKE.fullmatch(str(key))
                    else ""
                )
                issues.append(
                    ConfigIssue(
                        "placement.unknown_key",
                        f"unknown key '{key}' in the placement of '{component}'; "
                        f"expected node_group, placement and hide_accelerators{hint}",
                        (*path, key),
                        component=component,
                    )
                )
        if "placement" not in value:
            issues.append(
                ConfigIssue(
                    "placement.missing",
                    f"the placement of '{component}' has no 'placement' key (e.g. placement: 0-7)",
                    path,
                    component=component,
                )
            )
            return None
        text_path = (*path, "placement")
        if "node_group" in value:
            node_groups = _parse_node_group_labels(value["node_group"], component, path, issues)
            if node_groups is None:
                return None
        hide = value.get("hide_accelerators", False)
        if not isinstance(hide, bool):
            issues.append(
                ConfigIssue(
                    "placement.hide_accelerators",
                    f"hide_accelerators of '{component}' must be true or false, not {hide!r}",
                    (*path, "hide_accelerators"),
                    component=component,
                )
            )
            return None
        text = value["placement"]
    else:
        text = value
    if not isinstance(text, str):
        issues.append(
            ConfigIssue(
                "placement.type",
                f"the placement of '{component}' must be a string like '0-7' or "
                f"'0-3:0-7', not {type(text).__name__} {text!r}",
                text_path,
                component=component,
            )
        )
        return None
    segments, syntax_issues = parse_placement_string(text, component=component, path=text_path)
    issues.extend(syntax_issues)
    if syntax_issues:
        return None
    return ComponentRule(names, node_groups, text, tuple(segments), text_path, hide)


def _parse_node_group_labels(
    value: object, component: str, path: Path, issues: list[ConfigIssue]
) -> tuple[str, ...] | None:
    group_path = (*path, "node_group")
    labels: list[object]
    if isinstance(value, str):
        labels = [label.strip() for label in value.split(",")]
    elif isinstance(value, list):
        labels = [label.strip() if isinstance(label, str) else label for label in value]
    else:
        labels = [value]
    bad = [label for label in labels if not isinstance(label, str) or label == ""]
    if bad or not labels:
        issues.append(
            ConfigIssue(
                "placement.node_group_syntax",
                f"node_group of '{component}' must be a label or a comma-separated list of "
                f'labels such as "a800,4090"; got {value!r}',
                group_path,
                component=component,
            )
        )
        return None
    repeated = sorted({label for label in labels if labels.count(label) > 1})
    if repeated:
        issues.append(
            ConfigIssue(
                "placement.node_group_repeated",
                f"node_group of '{component}' lists {', '.join(map(str, repeated))} more than "
                "once; each group's resources may be numbered only once",
                group_path,
                component=component,
            )
        )
        return None
    return tuple(str(label) for label in labels)
