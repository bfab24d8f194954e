"""Resolving a component placement against a cluster into a `Plan`.

Ranges stay (first, count) pairs until the final loop, and resources are looked up in flat
per-rank arrays, so resolving is linear in the number of processes plus resources.
"""

from __future__ import annotations

import gc
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import ClusterConfigError, ConfigIssue, IssueCollector, Path, with_lines
from .grammar import Segment
from .model import CLUSTER_GROUP, NODE_GROUP, RESERVED_LABELS, Cluster
from .placement_spec import ComponentRule, parse_component_placement
from .plan import ACCELERATOR, HARDWARE, Plan, ProcessPlacement
from .resources import GroupResources, ResourceNumbering, group_resources, numbering
from .validation import validate_cluster

# Processes of one plan, all components together: bounds the memory and time of resolving
# a placement that anyone posts (about 0.3 s and 100 MB at the limit), and lies far above
# what one Ray cluster runs. A plan is counted before any process is built.
MAX_PROCESSES = 100_000
_PLACEMENT_PATH: Path = ("cluster", "component_placement")


def resolve_placement(
    cluster: Cluster,
    placement: Mapping[str, Any] | None = None,
    *,
    max_processes: int = MAX_PROCESSES,
    placement_lines: Mapping[Path, int] | None = None,
) -> Plan:
    """Resolve `placement` (the `component_placement` mapping, or None for the cluster's
    own) against `cluster`; `placement_lines`, the YAML lines of the mapping's keys where
    it was read from text (`yaml_io.resolve_placement_text` reads text).

    Raises `ClusterConfigError` with every problem in the cluster and the placement;
    `PlanTooLarge` (one) when it would make more than `max_processes` processes, all
    components together, counted before any is built.
    """
    # Line numbers: the cluster's own YAML for its entries; the placement's source for it.
    inventory_lines = {
        path: line
        for path, line in cluster.source_lines.items()
        if path[:2] != _PLACEMENT_PATH and len(path) > 1  # not even the `cluster:` line
    }
    if placement is None:
        raw: object = cluster.component_placement
        lines = dict(cluster.source_lines)
        if raw is None:
            raise ClusterConfigError(
                [
                    ConfigIssue(
                        "placement.missing",
                        "the cluster has no component_placement to resolve",
                        _PLACEMENT_PATH,
                    )
                ]
            )
    else:
        raw, lines = placement, inventory_lines | dict(placement_lines or {})
    issues = IssueCollector()
    cluster_issues = validate_cluster(cluster)
    issues.extend(cluster_issues)
    rules, rule_issues = parse_component_placement(raw)
    issues.extend(rule_issues)  # rules with syntax errors are left out of `rules`
    components: dict[str, list[ProcessPlacement]] = {}
    if not cluster_issues:
        resolver = _Resolver(cluster, issues, max_processes)
        # Building ~1e5 small objects triggers many useless cyclic-GC passes (they hold no
        # cycles); pausing the collector makes resolution faster and its timing steadier.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            for rule in rules:
                resolved = resolver.resolve(rule)
                if resolved is not None:
                    components.update(resolved)
        finally:
            if gc_was_enabled:
                gc.enable()
        if resolver.total > max_processes:
            raise PlanTooLarge(with_lines(issues.issues, lines), resolver.planned, max_processes)
    else:
        issues.extend(placement_arithmetic_issues(rules))
    if issues:
        raise ClusterConfigError(with_lines(issues.issues, lines))
    return Plan(cluster, components)


class PlanTooLarge(ClusterConfigError):
    """The placement makes more processes than allowed: `processes` by component (as far
    as they could be counted), `total`, `limit`. Nothing was built."""

    def __init__(self, issues: list[ConfigIssue], processes: dict[str, int], limit: int):
        self.processes, self.limit = dict(processes), limit
        self.total = sum(self.processes.values())
        counts = ", ".join(f"{name}: {count:,}" for name, count in self.processes.items())
        issue = ConfigIssue(
            "placement.too_many_processes",
            f"the placement makes {self.total:,} processes ({counts}); at most {limit:,} are "
            "allowed",
            _PLACEMENT_PATH,
        )
        super().__init__([issue, *issues])


def placement_arithmetic_issues(rules: list[ComponentRule]) -> list[ConfigIssue]:
    """Problems found without an inventory (whole multiples, process ranks, resource reuse),
    so a broken inventory does not hide the placement's own mistakes."""
    issues = IssueCollector()
    resolver = _Resolver(None, issues, MAX_PROCESSES)
    for rule in rules:
        resolver.check_without_cluster(rule)
    return issues.issues


@dataclass(slots=True)
class _SegmentPlan:
    segment: Segment
    resource_first: int
    resource_count: int
    process_first: int
    process_count: int


class _Resolver:
    def __init__(self, cluster: Cluster | None, issues: IssueCollector, max_processes: int) -> None:
        self.cluster = cluster  # None: only checks that need no inventory are possible
        self.issues = issues
        self.max_processes = max_processes
        self._groups: dict[str, GroupResources] = {}
        self._node_accelerators: list[tuple[str, tuple[int, ...]]] = []
        self.planned: dict[str, int] = {}  # processes by component, counted before building
        self.total = 0

    @property
    def node_accelerators(self) -> list[tuple[str, tuple[int, ...]]]:
        """Per node: its visibility variable name and its accelerators' indices."""
        if not self._node_accelerators and self.cluster is not None:
            self._node_accelerators = [
                (node.visibility_env_var, tuple(range(node.num_accelerators)))
                for node in self.cluster.nodes
            ]
        return self._node_accelerators

    def _environment(self, label: str, node: int) -> tuple[Mapping[str, str], str | None]:
        """Env vars and interpreter of a process placed through group `label` on `node`: the
        group's own, or, through the reserved groups, everything the node's groups set."""
        assert self.cluster is not None
        if label in RESERVED_LABELS:
            info = self.cluster.nodes[node]
            return info.env_vars, info.python_interpreter_path
        return self.cluster.group_environment(label, node)

    def _group(self, label: str) -> GroupResources:
        assert self.cluster is not None
        if label not in self._groups:
            self._groups[label] = group_resources(self.cluster, label)
        return self._groups[label]

    def _numbering(self, rule: ComponentRule, component: str) -> ResourceNumbering | None:
        labels = rule.node_groups or (CLUSTER_GROUP,)
        path = rule.path[:-1] if rule.node_groups else rule.path
        unknown = [
            label
            for label in labels
            if label not in RESERVED_LABELS and self.cluster.group(label) is None
        ]
        if unknown:
            known = ", ".join(group.label for group in self.cluster.node_groups) or "none"
            self.issues.add(
                "placement.unknown_node_group",
                f"component '{component}': node group {', '.join(map(repr, unknown))} does not "
                f"exist (defined groups: {known}; reserved: node, cluster)",
                (*path, "node_group"),
                component=component,
            )
            return None
        if len(labels) > 1 and any(label in RESERVED_LABELS for label in labels):
            self.issues.add(
                "placement.node_group_mix",
                f"component '{component}': the reserved groups 'node' and 'cluster' cannot be "
                "listed together with other groups",
                (*path, "node_group"),
                component=component,
            )
            return None
        groups = [self._group(label) for label in labels]
        if len(groups) > 1 and not self._groups_disjoint(groups, component, path):
            return None
        return numbering(groups)

    def _groups_disjoint(self, groups: list[GroupResources], component: str, path: Path) -> bool:
        owner: dict[int, str] = {}
        for group in groups:
            if group.kind == HARDWARE:
                continue  # devices are distinct even on a shared node
            for node in set(group.node_of):
                if node in owner:
                    self.issues.add(
                        "placement.node_group_overlap",
                        f"component '{component}': node {node} is in both '{owner[node]}' and "
                        f"'{group.label}', so its resources would be numbered twice",
                        (*path, "node_group"),
                        component=component,
                    )
                    return False
                owner[node] = group.label
        return True

    def resolve(self, rule: ComponentRule) -> dict[str, list[ProcessPlacement]] | None:
        component = _component_name(rule)
        resources = self._numbering(rule, component)
        if resources is None:
            return None
        plans = self._segment_plans(rule, component, resources)
        if plans is None:
            return None
        count = sum(plan.process_count for plan in plans)
        self.planned.update(dict.fromkeys(rule.components, count))
        self.total += count * len(rule.components)
        if self.total > self.max_processes:
            return None  # counted, never built: PlanTooLarge reports it
        slots = self._assign(rule, component, resources, plans)
        if slots is None or not self._interpreters_unambiguous(rule, component, resources, slots):
            return None
        return {
            name: self._placements(name, resources, slots, rule.hide_accelerators)
            for name in rule.components
        }

    def _interpreters_unambiguous(
        self,
        rule: ComponentRule,
        component: str,
        resources: ResourceNumbering,
        slots: list[tuple[int, int]],
    ) -> bool:
        """Through a user group a process gets that group's interpreter; through `node` or
        `cluster` it gets its node's, which must then be one."""
        assert self.cluster is not None
        label = resources.groups[0].label
        if label not in RESERVED_LABELS:
            return True
        node_of = resources.groups[0].node_of
        for node in sorted({node_of[first] for first, _count in slots}):
            by_group = self.cluster.nodes[node].python_interpreters
            if len(set(by_group.values())) > 1:
                named = ", ".join(f"{group}: {path}" for group, path in by_group.items())
                self._problem(
                    rule,
                    component,
                    None,
                    "placement.interpreter_ambiguous",
                    f"it is placed on node {node} through the reserved group '{label}', but "
                    f"the node's groups name different interpreters ({named}); place it "
                    "through one of those groups so it is clear which interpreter it runs",
                )
                return False
        return True

    def check_without_cluster(self, rule: ComponentRule) -> None:
        """Rules that need no inventory: whole multiples, process ranks, resource reuse."""
        self._segment_plans(rule, _component_name(rule), None)

    def _problem(
        self, rule: ComponentRule, component: str, segment: str | None, rule_id: str, message: str
    ) -> None:
        where = f"component '{component}'" + (f", segment '{segment}'" if segment else "")
        self.issues.add(
            rule_id, f"{where}: {message}", rule.path, component=component, segment=segment
        )

    def _segment_plans(
        self, rule: ComponentRule, component: str, resources: ResourceNumbering | None
    ) -> list[_SegmentPlan] | None:
        """Check and size each segment; `resources` None checks only what needs no cluster."""
        plans: list[_SegmentPlan] = []
        ok = True
        next_process = 0
        for segment in rule.segments:
            text = segment.text
            if resources is None:
                if segment.resources is None:
                    return None  # 'all' has no size without a cluster; later ranks unknown
                first, count = segment.resources.first, segment.resources.count
            elif segment.resources is None:
                first, count = 0, resources.count  # never 0: groups have >= 1 node or device
            else:
                first, count = segment.resources.first, segment.resources.count
                if segment.resources.last >= resources.count:
                    self._problem(
                        rule,
                        component,
                        text,
                        "placement.resource_out_of_range",
                        f"resource rank {segment.resources.last} does not exist: "
                        f"{resources.describe()} "
                        f"({'rank' if resources.count == 1 else 'ranks'} "
                        f"{_span(0, resources.count - 1)})",
                    )
                    ok = False
            if segment.processes is None:
                process_first, process_count = next_process, count
            else:
                process_first, process_count = segment.processes.first, segment.processes.count
            next_process = max(next_process, process_first + process_count)
            if process_count % count and count % process_count:
                self._problem(
                    rule,
                    component,
                    text,
                    "placement.whole_multiple",
                    _whole_multiple_message(process_first, process_count, count),
                )
                ok = False
            plans.append(_SegmentPlan(segment, first, count, process_first, process_count))
        ok = self._check_resources_unique(rule, component, plans) and ok
        ok = self._check_process_ranks(rule, component, plans) and ok
        return plans if ok else None

    def _check_resources_unique(
        self, rule: ComponentRule, component: str, plans: list[_SegmentPlan]
    ) -> bool:
        ordered = sorted(plans, key=lambda plan: plan.resource_first)
        ok = True
        for before, after in zip(ordered, ordered[1:], strict=False):
            if after.resource_first < before.resource_first + before.resource_count:
                shared_end = min(
                    after.resource_first + after.resource_count,
                    before.resource_first + before.resource_count,
                )
                self._problem(
                    rule,
                    component,
                    after.segment.text,
                    "placement.resource_reused",
                    f"{_ranks_phrase('resource', after.resource_first, shared_end - 1)} already "
                    f"used by segment '{before.segment.text}'; to share resources, give "
                    "one segment several process ranks (e.g. 0-1:0-3)",
                )
                ok = False
        return ok

    def _check_process_ranks(
        self, rule: ComponentRule, component: str, plans: list[_SegmentPlan]
    ) -> bool:
        """Process ranks must be exactly 0..N-1: no gaps, no repeats."""
        ordered = sorted(plans, key=lambda plan: plan.process_first)
        expected = 0
        owner: _SegmentPlan | None = None
        ok = True
        for plan in ordered:
            end = plan.process_first + plan.process_count
            if plan.process_first > expected:
                self._problem(
                    rule,
                    component,
                    plan.segment.text,
                    "placement.process_gap",
                    f"{_ranks_phrase('process rank', expected, plan.process_first - 1)} "
                    "missing; a "
                    "component's process ranks must run 0..N-1 without gaps",
                )
                ok = False
            elif plan.process_first < expected and owner is not None:
                self._problem(
                    rule,
                    component,
                    plan.segment.text,
                    "placement.process_repeated",
                    f"{_ranks_phrase('process rank', plan.process_first, min(end, expected) - 1)}"
                    f" already placed by segment '{owner.segment.text}'; each process rank "
                    "must appear once",
                )
                ok = False
            if end > expected:
                expected, owner = end, plan
        return ok

    def _assign(
        self,
        rule: ComponentRule,
        component: str,
        resources: ResourceNumbering,
        plans: list[_SegmentPlan],
    ) -> list[tuple[int, int]] | None:
        """(first resource, resource count) for each process rank."""
        total = sum(plan.process_count for plan in plans)
        slots: list[tuple[int, int]] = [(0, 0)] * total
        node_of, group_of = _flat_lookup(resources)
        ok = True
        for plan in plans:
            first, count = plan.resource_first, plan.resource_count
            base = plan.process_first
            if plan.process_count >= count:
                share = plan.process_count // count
                for index in range(plan.process_count):
                    slots[base + index] = (first + index // share, 1)
                continue
            width = count // plan.process_count
            for index in range(plan.process_count):
                start = first + index * width
                end = start + width - 1
                if node_of[start] != node_of[end] or group_of[start] != group_of[end]:
                    self._problem(
                        rule,
                        component,
                        plan.segment.text,
                        "placement.process_spans_nodes",
                        f"process {base + index} would get resources {start}-{end}, which lie "
                        f"on nodes {node_of[start]} and {node_of[end]}"
                        + ("" if group_of[start] == group_of[end] else " of different node groups")
                        + f"; a process cannot span nodes ({width} resources per process here)",
                    )
                    ok = False
                    break  # one report per segment is enough
                slots[base + index] = (start, width)
        return slots if ok else None

    def _placements(
        self,
        component: str,
        resources: ResourceNumbering,
        slots: list[tuple[int, int]],
        hide_accelerators: bool,
    ) -> list[ProcessPlacement]:
        single = resources.groups[0] if len(resources.groups) == 1 else None
        node_of = single.node_of if single is not None else _flat_lookup(resources)[0]
        # Local rank: the process's index among this component's processes on its node.
        local_ranks: list[int] = []
        per_node: dict[int, int] = {}
        for first, _count in slots:
            node = node_of[first]
            local = per_node.get(node, 0)
            local_ranks.append(local)
            per_node[node] = local + 1
        node_accelerators = self.node_accelerators
        # Per (group label, node): its environment, and the env of processes not placed on
        # accelerators (which depends on nothing else).
        environments: dict[tuple[str, int], tuple[Mapping[str, str], str | None]] = {}
        per_node_env: dict[tuple[str, int], tuple[tuple[int, ...], Mapping[str, str]]] = {}
        placements: list[ProcessPlacement] = []
        append = placements.append
        previous: tuple[int, int] | None = None
        for process_rank, slot in enumerate(slots):
            if slot != previous:
                # Processes sharing a resource have equal slots and come in a row: derive the
                # per-resource facts once and share them (they are immutable).
                previous = slot
                first, count = slot
                if single is not None:
                    group, group_first = single, first
                else:
                    group, group_first = resources.locate(first)
                node = group.node_of[group_first]
                if group.label == NODE_GROUP:
                    local_hardware: tuple[int, ...] = ()
                else:
                    local_hardware = tuple(group.local_of[group_first : group_first + count])
                key = (group.label, node)
                environment = environments.get(key)
                if environment is None:
                    environment = environments[key] = self._environment(*key)
                env, interpreter = environment
                if group.kind == ACCELERATOR:  # its own devices: one env per resource
                    visible = local_hardware
                    variable = node_accelerators[node][0]
                    env_vars = MappingProxyType({**env, variable: ",".join(map(str, visible))})
                else:  # the same for every process of this group on this node
                    shared = per_node_env.get(key)
                    if shared is None:
                        variable, accelerators = node_accelerators[node]
                        seen, with_visibility = _visibility(
                            env, variable, group.kind, (), accelerators, hide_accelerators
                        )
                        shared = per_node_env[key] = (seen, MappingProxyType(with_visibility))
                    visible, env_vars = shared
                resource_ranks = tuple(range(first, first + count))
                label, kind, hardware_type = group.label, group.kind, group.hardware_type
            append(
                ProcessPlacement(
                    component,
                    process_rank,
                    node,
                    local_ranks[process_rank],
                    per_node[node],
                    label,
                    kind,
                    hardware_type,
                    resource_ranks,
                    local_hardware,
                    visible,
                    env_vars,
                    interpreter,
                )
            )
        return placements


def _visibility(
    env: Mapping[str, str],
    variable: str,
    kind: str,
    local_hardware: tuple[int, ...],
    node_accelerators: tuple[int, ...],
    hide_accelerators: bool,
) -> tuple[tuple[int, ...], dict[str, str]]:
    """The accelerators a process sees, and `env` plus the visibility variable saying so.

    An accelerator-placed process sees only its own devices. Any other process (placed per
    node or on robots) sees every accelerator of its node, since robot drivers and
    simulators may render on them, unless its component asks to hide them. On a node with
    no declared accelerators such a process gets no variable at all, so nothing the
    inventory does not know about is hidden from it.
    """
    if kind == ACCELERATOR:
        visible = local_hardware
    elif hide_accelerators:
        visible = ()
    elif node_accelerators:
        visible = node_accelerators
    else:
        return (), dict(env)
    return visible, {**env, variable: ",".join(map(str, visible))}


def _component_name(rule: ComponentRule) -> str:
    return ",".join(rule.components)


def _flat_lookup(resources: ResourceNumbering) -> tuple[list[int], list[int]]:
    """Node and group index per global resource rank."""
    if len(resources.groups) == 1:
        group = resources.groups[0]
        return group.node_of, [0] * group.count
    node_of: list[int] = []
    group_of: list[int] = []
    for index, group in enumerate(resources.groups):
        node_of.extend(group.node_of)
        group_of.extend([index] * group.count)
    return node_of, group_of


def _ranks_phrase(noun: str, first: int, last: int) -> str:
    """'process rank 3 is' / 'process ranks 3-5 are'."""
    return f"{noun}s {first}-{last} are" if last > first else f"{noun} {first} is"


def _span(first: int, last: int) -> str:
    return f"{first}-{last}" if last > first else str(first)


def _whole_multiple_message(process_first: int, processes: int, resources: int) -> str:
    process_text = _span(process_first, process_first + processes - 1)
    if processes > resources:
        lower = processes // resources * resources
        upper = lower + resources
        fix = (
            f"with {resources} resources use a multiple of {resources} processes, e.g. "
            f"{_span(process_first, process_first + lower - 1)} ({lower // resources} per "
            f"resource) or {_span(process_first, process_first + upper - 1)} "
            f"({upper // resources} per resource)"
        )
    else:
        divisors = [d for d in range(1, resources + 1) if resources % d == 0]
        fix = (
            f"with {resources} resources use a process count that divides {resources} "
            f"({', '.join(map(str, divisors[:8]))}{', ...' if len(divisors) > 8 else ''})"
        )
    return (
        f"{processes} processes ({process_text}) on {resources} resources: neither count is a "
        "whole multiple of the other, so the processes cannot be spread evenly (each process "
        f"must get the same number of whole resources, or each resource the same number of "
        f"processes); {fix}"
    )
