"""Semantic rules of a cluster inventory (the seed's rules, one issue per broken rule).

Runs on a built `Cluster`, whether it came from YAML, from a dict or from Python code, and
returns every issue instead of stopping at the first.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping

from .errors import ConfigIssue, IssueCollector, Path
from .model import (
    RESERVED_LABELS,
    VISIBILITY_ENV_VARS,
    Accelerators,
    Cluster,
    EnvConfig,
    NodeGroup,
)
from .ranks import describe_nodes, format_ranks

_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_LABEL = re.compile(r"[^,\s]+")
_RESERVED_ENV_KEYS = frozenset(VISIBILITY_ENV_VARS.values())
# Nodes, accelerators and robots together. Resolving a placement numbers every resource,
# so this bounds the work of anyone who can post a cluster (a viewer's preview): 2^20
# resources are numbered in about 0.1 s; 100,000 nodes of 1024 accelerators took 32 s
# and 7 GB before this limit.
MAX_RESOURCES = 2**20


def validate_cluster(
    cluster: Cluster,
    *,
    path: Path = ("cluster",),
    origins: Mapping[int, Path] | None = None,
    unreadable_ranks: Collection[int] = frozenset(),
) -> list[ConfigIssue]:
    """Every rule violation in `cluster`.

    `origins` maps id(model object) -> its key path in the source document (without it,
    paths follow positions in the model); `unreadable_ranks` holds ids of groups and env
    configs whose node_ranks the reader already reported, so they are not reported twice.
    """
    return _ClusterRules(cluster, path, origins or {}, unreadable_ranks).run()


class _ClusterRules:
    def __init__(
        self,
        cluster: Cluster,
        path: Path,
        origins: Mapping[int, Path],
        unreadable_ranks: Collection[int],
    ) -> None:
        self.cluster = cluster
        self.root = path
        self.origins = origins
        self.unreadable_ranks = unreadable_ranks
        self.issues = IssueCollector()

    def where(self, obj: object, fallback: Path) -> Path:
        return self.origins.get(id(obj), fallback)

    def run(self) -> list[ConfigIssue]:
        cluster = self.cluster
        if (
            isinstance(cluster.num_nodes, bool)
            or not isinstance(cluster.num_nodes, int)
            or (cluster.num_nodes < 1)
        ):
            self.issues.add(
                "cluster.num_nodes",
                f"num_nodes must be a positive integer, not {cluster.num_nodes!r}",
                (*self.root, "num_nodes"),
            )
            return self.issues.issues
        self.labels()
        for index, group in enumerate(cluster.node_groups):
            group_path = self.where(group, (*self.root, "node_groups", index))
            self.ranks_in_range(group, (*group_path, "node_ranks"), f"node group '{group.label}'")
            self.env_configs(group, group_path)
            if group.hardware is not None:
                self.hardware(group, (*group_path, "hardware"))
            self.ignore_hardware(group, group_path)
        self.per_node_env()
        self.per_node_accelerators()
        self.resources_bounded()
        return self.issues.issues

    def resources_bounded(self) -> None:
        cluster = self.cluster
        robots = sum(len(g.hardware.configs) for g in cluster.node_groups if g.hardware)
        accelerators = sum(node.num_accelerators for node in cluster.nodes)
        total = cluster.num_nodes + accelerators + robots
        if total > MAX_RESOURCES:
            self.issues.add(
                "cluster.too_large",
                f"the cluster has {total:,} resources ({cluster.num_nodes:,} nodes, "
                f"{accelerators:,} accelerators, {robots:,} robots); at most "
                f"{MAX_RESOURCES:,} are supported",
                self.root,
            )

    def labels(self) -> None:
        first_seen: dict[str, int] = {}
        for index, group in enumerate(self.cluster.node_groups):
            path = (*self.where(group, (*self.root, "node_groups", index)), "label")
            label = group.label
            if not isinstance(label, str) or not _LABEL.fullmatch(label):
                self.issues.add(
                    "node_group.label",
                    f"node group label {label!r} must be a non-empty word without commas or "
                    "spaces (commas separate labels in node_group lists)",
                    path,
                )
            elif label in RESERVED_LABELS:
                self.issues.add(
                    "node_group.label_reserved",
                    f"node group label '{label}' is reserved by the scheduler ('cluster' is "
                    "the whole cluster, 'node' is every node by node rank); choose another",
                    path,
                )
            elif label in first_seen:
                self.issues.add(
                    "node_group.label_duplicate",
                    f"node group label '{label}' is used by node_groups[{first_seen[label]}] "
                    f"and node_groups[{index}]; labels must be unique (they are case-sensitive)",
                    path,
                )
            else:
                first_seen[label] = index

    def ranks_in_range(self, owner_object: NodeGroup | EnvConfig, path: Path, owner: str) -> bool:
        if id(owner_object) in self.unreadable_ranks:
            return False
        ranks = list(owner_object.node_ranks)
        if not ranks:
            self.issues.add("node_ranks.invalid", f"{owner}: node_ranks is empty", path)
            return False
        limit = self.cluster.num_nodes
        outside = [rank for rank in ranks if not isinstance(rank, int) or not 0 <= rank < limit]
        if outside:
            self.issues.add(
                "node_ranks.out_of_range",
                f"{owner}: node ranks {', '.join(map(str, outside[:10]))} are outside the "
                f"cluster's {limit} nodes (ranks 0-{limit - 1})",
                path,
            )
            return False
        if len(set(ranks)) != len(ranks):
            self.issues.add("node_ranks.invalid", f"{owner}: node_ranks lists a rank twice", path)
            return False
        return True

    def env_configs(self, group: NodeGroup, group_path: Path) -> None:
        group_ranks = set(group.node_ranks)
        claimed: dict[int, int] = {}
        for index, env in enumerate(group.env_configs):
            env_path = self.where(env, (*group_path, "env_configs", index))
            owner = f"env_configs[{index}] of node group '{group.label}'"
            if self.ranks_in_range(env, (*env_path, "node_ranks"), owner):
                outside = [rank for rank in env.node_ranks if rank not in group_ranks]
                if outside and id(group) not in self.unreadable_ranks:
                    self.issues.add(
                        "env_config.not_subset",
                        f"{owner} covers {describe_nodes(outside)}, outside the group (its "
                        f"node_ranks are {format_ranks(group.node_ranks)}); an env config's "
                        "node_ranks must be a subset of its group's",
                        (*env_path, "node_ranks"),
                    )
                overlap: dict[int, list[int]] = defaultdict(list)
                for rank in env.node_ranks:
                    if rank in claimed:
                        overlap[claimed[rank]].append(rank)
                    else:
                        claimed[rank] = index
                for other, ranks in overlap.items():
                    self.issues.add(
                        "env_config.overlap",
                        f"{owner} and env_configs[{other}] both cover "
                        f"{describe_nodes(ranks)}; env configs of one group must not overlap",
                        (*env_path, "node_ranks"),
                    )
            for key_index, (key, _value) in enumerate(env.env_vars):
                key_path = (*env_path, "env_vars", key_index)
                if not _ENV_KEY.fullmatch(key):
                    self.issues.add(
                        "env_var.key",
                        f"{owner}: '{key}' is not a valid environment variable name",
                        key_path,
                    )
                elif key in _RESERVED_ENV_KEYS:
                    self.issues.add(
                        "env_var.reserved",
                        f"{owner} sets {key}, which the placement sets per process to limit it "
                        "to its own accelerators; remove it",
                        key_path,
                    )
            interpreter = env.python_interpreter_path
            if interpreter is not None and (not interpreter or not os.path.isabs(interpreter)):
                self.issues.add(
                    "interpreter.path",
                    f"{owner}: python_interpreter_path {interpreter!r} must be an absolute path",
                    (*env_path, "python_interpreter_path"),
                )

    def per_node_env(self) -> None:
        """An env var key once per node across all groups (the seed's rule); one interpreter
        per node within a group. Groups sharing a node may name different interpreters: a
        process runs the one of the group it is placed through."""
        key_owner: dict[tuple[int, str], tuple[str, Path]] = {}
        interpreter_owner: dict[tuple[int, int], tuple[str, Path]] = {}
        key_clashes: dict[tuple[str, str, Path], list[int]] = defaultdict(list)
        interpreter_clashes: dict[tuple[str, Path], list[int]] = defaultdict(list)
        for group_index, group in enumerate(self.cluster.node_groups):
            group_path = self.where(group, (*self.root, "node_groups", group_index))
            for index, env in enumerate(group.env_configs):
                env_path = self.where(env, (*group_path, "env_configs", index))
                owner = f"node group '{group.label}' env_configs[{index}]"
                for key_index, (key, _value) in enumerate(env.env_vars):
                    key_path = (*env_path, "env_vars", key_index)
                    for rank in env.node_ranks:
                        previous = key_owner.setdefault((rank, key), (owner, key_path))
                        if previous[1] != key_path:
                            key_clashes[(key, previous[0], key_path)].append(rank)
                if env.python_interpreter_path is not None:
                    interpreter_path = (*env_path, "python_interpreter_path")
                    for rank in env.node_ranks:
                        previous = interpreter_owner.setdefault(
                            (group_index, rank), (owner, interpreter_path)
                        )
                        if previous[1] != interpreter_path:
                            interpreter_clashes[(previous[0], interpreter_path)].append(rank)
        for (key, first, where), ranks in key_clashes.items():
            self.issues.add(
                "env_var.duplicate",
                f"env var {key} is set more than once on {describe_nodes(ranks)} (already "
                f"by {first}); a key may be set only once per node across all env configs "
                "and groups",
                where,
            )
        for (first, where), ranks in interpreter_clashes.items():
            self.issues.add(
                "interpreter.duplicate",
                f"python_interpreter_path is set more than once for {describe_nodes(ranks)} "
                f"(already by {first}); a node group may give each node at most one "
                "interpreter",
                where,
            )

    def ignore_hardware(self, group: NodeGroup, group_path: Path) -> None:
        path = (*group_path, "ignore_hardware")
        if not isinstance(group.ignore_hardware, bool):
            self.issues.add(
                "node_group.ignore_hardware",
                f"ignore_hardware of node group '{group.label}' must be true or false",
                path,
            )
        elif group.ignore_hardware and group.hardware is not None:
            # RLinf would still place on the declared hardware; saying both is a mistake.
            self.issues.add(
                "node_group.ignore_hardware_conflict",
                f"node group '{group.label}' declares {group.hardware.type} hardware and sets "
                "ignore_hardware: true; ignore_hardware makes the group's nodes its resources, "
                "so remove one of the two",
                path,
            )

    def hardware(self, group: NodeGroup, path: Path) -> None:
        hardware = group.hardware
        assert hardware is not None
        if not isinstance(hardware.type, str) or not hardware.type:
            self.issues.add("hardware.type", f"hardware of '{group.label}' needs a type", path)
        if not hardware.configs:
            self.issues.add(
                "hardware.configs", f"hardware of '{group.label}' lists no configs", path
            )
        group_ranks = set(group.node_ranks)
        for index, config in enumerate(hardware.configs):
            config_path = self.where(config, (*path, "configs", index))
            owner = f"{hardware.type} hardware config {index} of node group '{group.label}'"
            if config.node_rank not in group_ranks and id(group) not in self.unreadable_ranks:
                self.issues.add(
                    "hardware.node_rank",
                    f"{owner} is on node {config.node_rank}, which is not in the group "
                    f"(node_ranks {format_ranks(group.node_ranks)})",
                    (*config_path, "node_rank"),
                )
            if config.robot_ip is not None:
                try:
                    ipaddress.ip_address(config.robot_ip)
                except ValueError:
                    # Only parsed, never contacted: addresses in a config are data.
                    self.issues.add(
                        "hardware.robot_ip",
                        f"{owner}: robot_ip {config.robot_ip!r} is not an IP address",
                        (*config_path, "robot_ip"),
                    )
            if config.camera_serials is not None and not all(
                isinstance(serial, str) and serial for serial in config.camera_serials
            ):
                self.issues.add(
                    "hardware.camera_serials",
                    f"{owner}: camera_serials must be non-empty strings",
                    (*config_path, "camera_serials"),
                )

    def per_node_accelerators(self) -> None:
        """A node's accelerators may be declared in several places only if they agree."""
        declared: dict[int, tuple[Accelerators, str]] = {}
        clashes: dict[tuple[str, str, Path], list[int]] = defaultdict(list)
        sources: list[tuple[Iterable[int], Accelerators, str, Path]] = []
        for index, entry in enumerate(self.cluster.accelerators):
            path = self.where(entry, (*self.root, "accelerators", index))
            sources.append((entry.node_ranks, entry.accelerators, f"accelerators[{index}]", path))
        for index, group in enumerate(self.cluster.node_groups):
            if group.accelerators is not None:
                path = (*self.where(group, (*self.root, "node_groups", index)), "accelerators")
                sources.append(
                    (group.node_ranks, group.accelerators, f"node group '{group.label}'", path)
                )
        for ranks, accelerators, owner, path in sources:
            if not isinstance(accelerators.count, int) or accelerators.count < 1:
                self.issues.add(
                    "accelerators.count",
                    f"{owner}: accelerator count must be a positive integer",
                    path,
                )
            if accelerators.vendor is not None and accelerators.vendor not in VISIBILITY_ENV_VARS:
                self.issues.add(
                    "accelerators.vendor",
                    f"{owner}: vendor must be one of {', '.join(VISIBILITY_ENV_VARS)}",
                    path,
                )
            for rank in ranks:
                previous = declared.setdefault(rank, (accelerators, owner))
                if previous[0] != accelerators:
                    clashes[(previous[1], owner, path)].append(rank)
        for (first, second, path), ranks in clashes.items():
            self.issues.add(
                "accelerators.conflict",
                f"accelerators of {describe_nodes(ranks)} are declared differently by {first} "
                f"and {second}; a node has one set of accelerators",
                path,
            )
