"""Typed cluster inventory: nodes, node groups, their software environments and hardware.

The classes are plain frozen dataclasses; they are built and checked by
`trainer.cluster.config.cluster_from_dict` (or the YAML loader), which reports every
problem as a `ClusterConfigError`. Derived per-node facts (accelerators, env vars,
interpreter) are computed once and cached.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

# Labels the scheduler owns: `cluster` is every node (accelerators as resources) and
# `node` is every node with node ranks as resources (for CPU-only processes).
CLUSTER_GROUP = "cluster"
NODE_GROUP = "node"
RESERVED_LABELS = frozenset({CLUSTER_GROUP, NODE_GROUP})

# The variable that limits a process to its accelerators, by vendor.
VISIBILITY_ENV_VARS = {
    "nvidia": "CUDA_VISIBLE_DEVICES",
    "amd": "HIP_VISIBLE_DEVICES",  # the variable Ray itself manages for AMD GPUs
    "ascend": "ASCEND_RT_VISIBLE_DEVICES",
}
DEFAULT_VENDOR = "nvidia"


@dataclass(frozen=True)
class Accelerators:
    """Accelerators on each node of a node group (declared, or discovered from Ray)."""

    type: str
    count: int
    vendor: str | None = None  # None means NVIDIA; kept as written for a lossless export

    @property
    def visibility_env_var(self) -> str:
        return VISIBILITY_ENV_VARS[self.vendor or DEFAULT_VENDOR]


@dataclass(frozen=True)
class AcceleratorDeclaration:
    """Cluster-level `accelerators:` entry: accelerators on nodes outside any group's own
    declaration (this is how accelerators discovered from a live Ray cluster are stored)."""

    node_ranks: tuple[int, ...]
    accelerators: Accelerators


@dataclass(frozen=True)
class EnvConfig:
    """Software environment for a subset of a node group's nodes."""

    node_ranks: tuple[int, ...]
    env_vars: tuple[tuple[str, str], ...] = ()
    python_interpreter_path: str | None = None


@dataclass(frozen=True)
class HardwareConfig:
    """One piece of non-accelerator hardware (e.g. a robot arm) attached to a node.

    `robot_ip` and `camera_serials` are data only: nothing here ever connects to them.
    Keys other than the known ones are kept in `extra` so an export loses nothing.
    """

    node_rank: int
    robot_ip: str | None = None
    camera_serials: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Hardware:
    """The hardware of a node group; when present it is the group's only resource."""

    type: str
    configs: tuple[HardwareConfig, ...]


@dataclass(frozen=True)
class NodeGroup:
    label: str
    node_ranks: tuple[int, ...]
    env_configs: tuple[EnvConfig, ...] = ()
    hardware: Hardware | None = None
    accelerators: Accelerators | None = None
    # RLinf's `ignore_hardware: true`: the group's resources are its nodes, whatever
    # accelerators they have (its processes still see them all).
    ignore_hardware: bool = False


@dataclass(frozen=True)
class NodeInfo:
    """What the inventory says about one node, across all the groups it belongs to.

    A process gets the env vars and interpreter of the group it is placed through
    (`Cluster.group_environment`); these node-wide values serve processes placed through
    the reserved `node` and `cluster` groups. `env_vars` merges every group's (a key is set
    once per node across groups); `python_interpreter_path` is the node's interpreter when
    its groups name at most one, None when they name none or differ (see
    `python_interpreters`, by group label).
    """

    rank: int
    accelerators: Accelerators | None
    env_vars: Mapping[str, str]
    python_interpreter_path: str | None
    python_interpreters: Mapping[str, str] = field(default_factory=dict)

    @property
    def num_accelerators(self) -> int:
        return self.accelerators.count if self.accelerators else 0

    @property
    def visibility_env_var(self) -> str:
        if self.accelerators is None:
            return VISIBILITY_ENV_VARS[DEFAULT_VENDOR]
        return self.accelerators.visibility_env_var


@dataclass(frozen=True)
class Cluster:
    """A cluster inventory plus, optionally, the `component_placement` it was written with."""

    num_nodes: int
    node_groups: tuple[NodeGroup, ...] = ()
    accelerators: tuple[AcceleratorDeclaration, ...] = ()
    # Kept as the user wrote it (normalised to strings) so it exports unchanged.
    component_placement: Mapping[str, Any] | None = None
    # YAML line of each key path, when loaded from text; lets later errors (a placement
    # that does not resolve) point at a line. Not part of the cluster's identity.
    source_lines: Mapping[tuple[str | int, ...], int] = field(
        default_factory=dict, compare=False, repr=False
    )

    def group(self, label: str) -> NodeGroup | None:
        return self._groups_by_label.get(label)

    def node(self, rank: int) -> NodeInfo:
        return self.nodes[rank]

    @cached_property
    def _groups_by_label(self) -> dict[str, NodeGroup]:
        return {group.label: group for group in self.node_groups}

    def group_environment(self, label: str, rank: int) -> tuple[Mapping[str, str], str | None]:
        """Env vars and interpreter a process placed through group `label` gets on node
        `rank` (the group's env config covering that node; nothing when none does)."""
        return self._group_environments.get(label, {}).get(rank, ({}, None))

    @cached_property
    def _group_environments(
        self,
    ) -> dict[str, dict[int, tuple[Mapping[str, str], str | None]]]:
        """Per group label, per node rank: (env vars, interpreter). Conflicts are validation
        errors; on an unvalidated cluster the first declaration wins here."""
        environments: dict[str, dict[int, tuple[Mapping[str, str], str | None]]] = {}
        for group in self.node_groups:
            per_node: dict[int, tuple[dict[str, str], str | None]] = {}
            for env in group.env_configs:
                for rank in env.node_ranks:
                    node_env, interpreter = per_node.get(rank, ({}, None))
                    for key, value in env.env_vars:
                        node_env.setdefault(key, value)
                    per_node[rank] = (node_env, interpreter or env.python_interpreter_path)
            environments.setdefault(group.label, per_node)
        return environments

    @cached_property
    def nodes(self) -> tuple[NodeInfo, ...]:
        """Per-node facts. Conflicts (two accelerator declarations...) are validation errors;
        on an unvalidated cluster the first declaration wins here."""
        accelerators: dict[int, Accelerators] = {}
        for declaration in self.accelerators:
            for rank in declaration.node_ranks:
                accelerators.setdefault(rank, declaration.accelerators)
        env_vars: dict[int, dict[str, str]] = {}
        interpreters: dict[int, dict[str, str]] = {}
        for group in self.node_groups:
            if group.accelerators is not None:
                for rank in group.node_ranks:
                    accelerators.setdefault(rank, group.accelerators)
        for label, per_node in self._group_environments.items():
            for rank, (group_env, interpreter) in per_node.items():
                node_env = env_vars.setdefault(rank, {})
                for key, value in group_env.items():
                    node_env.setdefault(key, value)
                if interpreter is not None:
                    interpreters.setdefault(rank, {})[label] = interpreter
        nodes = []
        for rank in range(self.num_nodes):
            by_group = interpreters.get(rank, {})
            distinct = set(by_group.values())
            nodes.append(
                NodeInfo(
                    rank=rank,
                    accelerators=accelerators.get(rank),
                    env_vars=env_vars.get(rank, {}),
                    python_interpreter_path=distinct.pop() if len(distinct) == 1 else None,
                    python_interpreters=by_group,
                )
            )
        return tuple(nodes)
