"""Numbering of the resources a placement string counts, for one node group or a list.

A group with `ignore_hardware` counts its nodes. A group with `hardware` counts its hardware
(in node order, then as listed); a group without
counts its nodes' accelerators (node order, then device index) or, when none of its nodes
has accelerators, the nodes themselves. The reserved `node` group counts every node by
node rank; the reserved `cluster` group (the short form) is every node without hardware.
Several groups are numbered one after the other in the order given.
"""

from __future__ import annotations

from dataclasses import dataclass

from .model import CLUSTER_GROUP, NODE_GROUP, Cluster
from .plan import ACCELERATOR, HARDWARE, NODE


@dataclass(frozen=True, slots=True)
class GroupResources:
    """Resources of one group; arrays are indexed by the group-relative resource rank."""

    label: str
    kind: str
    hardware_type: str | None
    node_of: list[int]
    local_of: list[int]  # index on the node; -1 for the reserved `node` group (no hardware)
    # For the reserved groups, which the user never wrote: the labels of the YAML's
    # groups whose nodes they count, so messages name what the user wrote.
    covers: tuple[str, ...] = ()

    @property
    def count(self) -> int:
        return len(self.node_of)

    def describe(self) -> str:
        noun = {ACCELERATOR: "accelerator", HARDWARE: f"{self.hardware_type} device"}.get(
            self.kind, "node"
        )
        counted = f"{self.count} {noun}{'s' if self.count != 1 else ''}"
        if self.label not in (NODE_GROUP, CLUSTER_GROUP):
            return f"node group '{self.label}' has {counted}"
        named = ", ".join(f"'{label}'" for label in self.covers)
        groups = f" (node group{'s' if len(self.covers) != 1 else ''} {named})" if named else ""
        how = "by node" if self.label == NODE_GROUP else "without a node_group"
        return f"the whole cluster{groups}, placed {how}, has {counted}"


@dataclass(frozen=True, slots=True)
class ResourceNumbering:
    """Resources of one or several groups, numbered consecutively."""

    groups: tuple[GroupResources, ...]
    offsets: tuple[int, ...]  # first global rank of each group
    count: int

    def locate(self, rank: int) -> tuple[GroupResources, int]:
        """(group, rank within the group) for a global resource rank."""
        index = len(self.offsets) - 1
        while self.offsets[index] > rank:
            index -= 1
        return self.groups[index], rank - self.offsets[index]

    def describe(self) -> str:
        return "; ".join(group.describe() for group in self.groups)


def group_resources(cluster: Cluster, label: str) -> GroupResources:
    """Resources of one group (the label must exist or be reserved)."""
    nodes = cluster.nodes
    covers = tuple(group.label for group in cluster.node_groups)
    if label == NODE_GROUP:
        ranks = list(range(cluster.num_nodes))
        return GroupResources(label, NODE, None, ranks, [-1] * len(ranks), covers)
    if label == CLUSTER_GROUP:
        node_ranks: list[int] = list(range(cluster.num_nodes))
        covers = tuple(group.label for group in cluster.node_groups if group.hardware is None)
    else:
        group = cluster.group(label)
        assert group is not None, label
        if group.ignore_hardware:
            ranks = sorted(group.node_ranks)
            return GroupResources(label, NODE, None, ranks, [0] * len(ranks))
        if group.hardware is not None:
            node_of: list[int] = []
            local_of: list[int] = []
            per_node: dict[int, int] = {}
            configs = sorted(group.hardware.configs, key=lambda config: config.node_rank)
            for config in configs:
                node_of.append(config.node_rank)
                local_of.append(per_node.get(config.node_rank, 0))
                per_node[config.node_rank] = local_of[-1] + 1
            return GroupResources(label, HARDWARE, group.hardware.type, node_of, local_of)
        node_ranks = sorted(group.node_ranks)
    counts = [nodes[rank].num_accelerators for rank in node_ranks]
    if any(counts):
        node_of, local_of = [], []
        types = {nodes[rank].accelerators.type for rank in node_ranks if nodes[rank].accelerators}
        for rank, count in zip(node_ranks, counts, strict=True):
            node_of.extend([rank] * count)
            local_of.extend(range(count))
        kind_type = types.pop() if len(types) == 1 else None
        return GroupResources(label, ACCELERATOR, kind_type, node_of, local_of, covers)
    return GroupResources(label, NODE, None, node_ranks, [0] * len(node_ranks), covers)


def numbering(groups: list[GroupResources]) -> ResourceNumbering:
    offsets = []
    total = 0
    for group in groups:
        offsets.append(total)
        total += group.count
    return ResourceNumbering(tuple(groups), tuple(offsets), total)
