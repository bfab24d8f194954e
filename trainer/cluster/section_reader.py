"""Reading a raw `cluster:` section into the typed model, with every structural problem.

The section is validated against `section_schema` in one pass, so every problem is
reported at once, each with its rule and key path. What could not be read is then left
out (a malformed node group, an optional field that is wrong) or read as unknown (node
ranks), the rest is validated again and built, and the semantic rules of
`trainer.cluster.validation` still run on every entry that could be read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from .errors import ConfigIssue, Path
from .model import (
    AcceleratorDeclaration,
    Accelerators,
    Cluster,
    EnvConfig,
    Hardware,
    HardwareConfig,
    NodeGroup,
)
from .placement_spec import ComponentRule, normalize_placement_value, parse_component_placement
from .schema_problems import Finding, issue_for, locate
from .section_schema import (
    MAX_NODES,
    SKIPPED,
    UNREAD_RANKS,
    AcceleratorsEntry,
    ClusterSection,
    NodeGroupEntry,
    NumNodes,
)

_NUM_NODES: TypeAdapter[int] = TypeAdapter(NumNodes)
_LEFT_OUT = object()  # what a cut does to a key or a list entry that cannot be read


@dataclass
class SectionReading:
    """A section as far as it could be read: the cluster (None when even its size could
    not be), every structural problem, and what the semantic rules need to know."""

    cluster: Cluster | None = None
    issues: list[ConfigIssue] = field(default_factory=list)
    # Where each built object came from, so semantic errors name the right list index
    # even when an earlier, malformed entry was left out.
    origins: dict[int, Path] = field(default_factory=dict)
    # Groups and env configs whose node_ranks were unreadable (already reported).
    unreadable: set[int] = field(default_factory=set)
    placement_rules: list[ComponentRule] = field(default_factory=list)


def read_section(section: object, path: Path) -> SectionReading:
    """Read `section` (the contents of a `cluster:` key at `path`)."""
    reading = SectionReading()
    context = {"num_nodes": _num_nodes(section)}
    parsed: ClusterSection | None = None
    try:
        parsed = ClusterSection.model_validate(section, context=context)
    except ValidationError as error:
        findings = [(problem, locate(problem, section)) for problem in error.errors()]
        reading.issues = [issue_for(problem, found, path) for problem, found in findings]
        salvaged = _salvage(section, [found for _, found in findings])
        if salvaged is not None:
            try:
                parsed = ClusterSection.model_validate(salvaged, context=context)
            except ValidationError:
                parsed = None  # reported above; nothing more can be built
    placement = section.get("component_placement") if isinstance(section, Mapping) else None
    if placement is not None:
        rules, issues = parse_component_placement(placement, (*path, "component_placement"))
        reading.placement_rules = rules
        reading.issues.extend(issues)
    if parsed is not None:
        reading.cluster = _Builder(reading, path).cluster(parsed, placement)
    return reading


def _num_nodes(section: object) -> int:
    """The node count ranks are read against: the section's or, while that is wrong
    (reported as such), the largest supported, which still bounds a range's size."""
    if isinstance(section, Mapping):
        try:
            return _NUM_NODES.validate_python(section.get("num_nodes"))
        except ValidationError:
            pass
    return MAX_NODES


# ---- leaving out what cannot be read --------------------------------------------------


def _salvage(section: object, findings: Sequence[Finding]) -> object | None:
    """`section` without what the findings cannot read; None when that is the section
    itself or its size."""
    cuts: dict[Path, object] = {}
    for found in findings:
        if found.cut is None:
            return None
        cuts[found.cut] = UNREAD_RANKS if found.unread_ranks else _LEFT_OUT
    salvaged = section
    for cut in sorted(cuts, key=len):
        if any(cuts.get(cut[:end]) is _LEFT_OUT for end in range(1, len(cut))):
            continue  # inside something already left out
        salvaged = _replaced(salvaged, cut, cuts[cut])
    return salvaged


def _replaced(data: Any, path: Path, value: object) -> Any:
    """`data` with `path` replaced by `value` (left out: a key removed, a list entry
    skipped), copying only what lies on the path."""
    head, rest = path[0], path[1:]
    if isinstance(data, Mapping):
        copy = {str(key): item for key, item in data.items()}  # as the schema reads keys
        if rest:
            copy[str(head)] = _replaced(copy[str(head)], rest, value)
        elif value is _LEFT_OUT:
            copy.pop(str(head), None)
        else:
            copy[str(head)] = value
        return copy
    items = list(data)
    assert isinstance(head, int)
    if rest:
        items[head] = _replaced(items[head], rest, value)
    else:
        items[head] = SKIPPED if value is _LEFT_OUT else value
    return items


# ---- the typed model ------------------------------------------------------------------


class _Builder:
    def __init__(self, reading: SectionReading, root: Path) -> None:
        self.reading = reading
        self.root = root

    def _built(self, built: Any, path: Path, ranks: tuple[int, ...] | None = None) -> Any:
        self.reading.origins[id(built)] = path
        if ranks is UNREAD_RANKS:
            self.reading.unreadable.add(id(built))
        return built

    def cluster(self, section: ClusterSection, placement: object) -> Cluster:
        groups = [
            self.group(entry, (*self.root, "node_groups", index))
            for index, entry in _kept(section.node_groups)
        ]
        declarations = [
            self._built(
                AcceleratorDeclaration(entry.node_ranks, _accelerators(entry)),
                (*self.root, "accelerators", index),
            )
            for index, entry in _kept(section.accelerators)
            if entry.node_ranks is not UNREAD_RANKS  # nodes unknown: nothing declared
        ]
        # Kept as the user wrote it (normalised to strings) so it exports unchanged.
        written = None
        if isinstance(placement, Mapping):
            written = {str(key): normalize_placement_value(v) for key, v in placement.items()}
        return Cluster(section.num_nodes, tuple(groups), tuple(declarations), written)

    def group(self, entry: NodeGroupEntry, path: Path) -> NodeGroup:
        envs = [
            self._built(
                EnvConfig(
                    tuple(env.node_ranks),
                    tuple(
                        (key, value) for pair in env.env_vars or () for key, value in pair.items()
                    ),
                    env.python_interpreter_path,
                ),
                (*path, "env_configs", index),
                env.node_ranks,
            )
            for index, env in _kept(entry.env_configs)
        ]
        hardware = None
        if entry.hardware is not None:
            configs = tuple(
                self._built(
                    HardwareConfig(
                        config.node_rank,
                        config.robot_ip,
                        tuple(config.camera_serials) if config.camera_serials is not None else None,
                        dict(config.model_extra or {}),
                    ),
                    (*path, "hardware", "configs", index),
                )
                for index, config in enumerate(entry.hardware.configs)
            )
            hardware = Hardware(entry.hardware.type, configs)
        accelerators = _accelerators(entry.accelerators) if entry.accelerators else None
        group = NodeGroup(
            entry.label,
            tuple(entry.node_ranks),
            tuple(envs),
            hardware,
            accelerators,
            entry.ignore_hardware,
        )
        return self._built(group, path, entry.node_ranks)


def _kept(entries: Sequence[Any] | None) -> list[tuple[int, Any]]:
    """The entries read, with their index in the section."""
    return [(index, entry) for index, entry in enumerate(entries or ()) if entry is not SKIPPED]


def _accelerators(entry: AcceleratorsEntry) -> Accelerators:
    return Accelerators(entry.type, entry.count, entry.vendor)
