"""YAML text for the `cluster:` section, read as YAML 1.2.

YAML 1.1 loaders (PyYAML's default, OmegaConf) read an unquoted `1:2` as the base-60
integer 62, silently turning `placement: 1:2` into resource rank 62. ruamel.yaml follows
YAML 1.2, where `1:2` stays the text the user wrote. Exports quote every placement and
rank string, and any other string a YAML 1.1 reader would take for something else (an
env var's `1:2`, `yes`, `0x10`), so that such a reader gets them right too.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import MarkedYAMLError, YAMLError
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from trainer.bounded_yaml import YamlLimitError, load_bounded

from .config import cluster_from_dict, cluster_to_dict
from .errors import ClusterConfigError, ConfigIssue, Path, with_lines
from .model import Cluster
from .plan import Plan
from .resolution import MAX_PROCESSES, resolve_placement

ROOT: Path = ("cluster",)
PLACEMENT_ROOT: Path = ("cluster", "component_placement")


def load_cluster_yaml(text: str) -> Cluster:
    """Read a YAML document with a top-level `cluster:` section (or the bare section).

    Raises `ClusterConfigError` (with line numbers) for YAML syntax errors and every
    invalid entry.
    """
    data, lines = _parse(text)
    if isinstance(data, Mapping) and "cluster" in data:
        section = data["cluster"]
    elif isinstance(data, Mapping) and "num_nodes" in data:
        section, lines = data, _reroot(lines, (), ROOT)
    else:
        raise ClusterConfigError(
            [ConfigIssue("yaml.no_cluster", "the YAML has no top-level 'cluster:' section", ())]
        )
    try:
        cluster = cluster_from_dict(section, ROOT)
    except ClusterConfigError as error:
        raise ClusterConfigError(with_lines(error.issues, lines)) from None
    object.__setattr__(cluster, "source_lines", lines)  # frozen; lines are not identity
    return cluster


def load_placement_yaml(text: str) -> tuple[object, dict[Path, int]]:
    """Read a `component_placement` mapping from YAML text: either the mapping itself, or a
    document with `component_placement:` or `cluster: {component_placement: ...}`.

    Returns the raw mapping and its key lines, keyed from `cluster.component_placement`.
    """
    data, lines = _parse(text)
    if isinstance(data, Mapping) and isinstance(data.get("cluster"), Mapping):
        return data["cluster"].get("component_placement"), lines
    if isinstance(data, Mapping) and "component_placement" in data:
        return data["component_placement"], _reroot(lines, ("component_placement",), PLACEMENT_ROOT)
    return data, _reroot(lines, (), PLACEMENT_ROOT)


def resolve_placement_text(
    cluster: Cluster, text: str, *, max_processes: int = MAX_PROCESSES
) -> Plan:
    """`resolve_placement` of a placement written as YAML (`load_placement_yaml`'s forms),
    its errors pointing at the text's lines."""
    raw, lines = load_placement_yaml(text)
    return resolve_placement(cluster, raw, max_processes=max_processes, placement_lines=lines)


def dump_cluster_yaml(cluster: Cluster) -> str:
    """The YAML document `cluster: ...` for `cluster` (round-trips through the loader)."""
    section = cluster_to_dict(cluster)
    _quote_rank_text(section)
    stream = io.StringIO()
    _yaml().dump({"cluster": section}, stream)
    return stream.getvalue()


def _yaml() -> YAML:
    yaml = YAML(typ="rt")  # round-trip mode keeps line numbers; it reads YAML 1.2
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.default_flow_style = False
    yaml.width = 4096  # never fold long placement strings
    return yaml


def _parse(text: str) -> tuple[Any, dict[Path, int]]:
    try:
        document = load_bounded(text, typ="rt")  # round-trip mode keeps line numbers
    except YAMLError as error:
        line = None
        if isinstance(error, MarkedYAMLError) and error.problem_mark is not None:
            line = error.problem_mark.line + 1
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        if isinstance(error, YamlLimitError):
            issue = ConfigIssue("yaml.limit", f"YAML refused: {problem}", (), line=line)
        else:
            issue = ConfigIssue("yaml.syntax", f"invalid YAML: {problem}", (), line=line)
        raise ClusterConfigError([issue]) from None
    lines: dict[Path, int] = {}
    return _plain(document, (), lines), lines


def _plain(node: Any, path: Path, lines: dict[Path, int]) -> Any:
    """Convert ruamel's round-trip types to plain Python, recording each key's line."""
    if isinstance(node, CommentedMap):
        result = {}
        for key, value in node.items():
            plain_key = _plain(key, path, {})
            child = (*path, plain_key if isinstance(plain_key, int) else str(plain_key))
            position = node.lc.key(key) if hasattr(node, "lc") else None
            if position is not None:
                lines[child] = position[0] + 1
            result[plain_key] = _plain(value, child, lines)
        return result
    if isinstance(node, CommentedSeq):
        items = []
        for index, value in enumerate(node):
            child = (*path, index)
            position = node.lc.item(index) if hasattr(node, "lc") else None
            if position is not None:
                lines[child] = position[0] + 1
            items.append(_plain(value, child, lines))
        return items
    if isinstance(node, bool) or type(node).__name__ == "ScalarBoolean":
        return bool(node)
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def _reroot(lines: dict[Path, int], old: Path, new: Path) -> dict[Path, int]:
    size = len(old)
    return {(*new, *path[size:]): line for path, line in lines.items() if path[:size] == old}


def _read_as_yaml_1_1(text: str) -> Any:
    reader = YAML(typ="safe", pure=True)
    reader.version = (1, 1)
    try:
        return reader.load(text)
    except YAMLError:
        return None


def _quote_for_yaml_1_1(node: Any) -> Any:
    """`node` with every string a YAML 1.1 reader would not read back as itself
    double-quoted."""
    if isinstance(node, dict):
        return {key: _quote_for_yaml_1_1(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_quote_for_yaml_1_1(value) for value in node]
    if isinstance(node, str) and _read_as_yaml_1_1(node) != node:
        return DoubleQuotedScalarString(node)
    return node


def _quote_rank_text(section: dict[str, Any]) -> None:
    """Double-quote placement and rank strings (`1:2` unquoted is 62 to a YAML 1.1
    reader), and whatever else such a reader would misread."""
    for key, value in _quote_for_yaml_1_1(section).items():
        section[key] = value
    placement = section.get("component_placement") or {}
    for key, value in placement.items():
        if isinstance(value, str):
            placement[key] = DoubleQuotedScalarString(value)
        elif isinstance(value, dict):
            for field in ("placement", "node_group"):
                if isinstance(value.get(field), str):
                    value[field] = DoubleQuotedScalarString(value[field])
    for group in section.get("node_groups", []):
        group["node_ranks"] = DoubleQuotedScalarString(group["node_ranks"])
        for env in group.get("env_configs", []):
            env["node_ranks"] = DoubleQuotedScalarString(env["node_ranks"])
    for entry in section.get("accelerators", []):
        entry["node_ranks"] = DoubleQuotedScalarString(entry["node_ranks"])
