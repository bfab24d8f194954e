"""Building a cluster inventory from a live Ray cluster's node list.

Works on the dicts returned by `ray.nodes()` (passed in, so this module needs no Ray
connection). Each node states its rank with the node label `armature.io/node-rank`
(`ray start --labels=armature.io/node-rank=3`), the way RLinf uses RLINF_NODE_RANK; a
one-node cluster needs no label. An optional `armature.io/node-group` label puts nodes in
a node group. Accelerators come from the node's `GPU`/`NPU` resources and Ray's
`accelerator_type:<TYPE>` resource.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .errors import ClusterConfigError, ConfigIssue
from .model import AcceleratorDeclaration, Accelerators, Cluster, NodeGroup
from .validation import validate_cluster

NODE_RANK_LABEL = "armature.io/node-rank"
NODE_GROUP_LABEL = "armature.io/node-group"
_ACCELERATOR_TYPE_PREFIX = "accelerator_type:"


def ranked_ray_nodes(nodes: Sequence[Mapping[str, Any]]) -> dict[int, Mapping[str, Any]]:
    """Alive Ray nodes by Armature node rank; raises `ClusterConfigError` if ranks are
    missing, malformed, repeated or not exactly 0..N-1."""
    alive = [node for node in nodes if node.get("Alive", node.get("alive", False))]
    problems: list[ConfigIssue] = []
    if not alive:
        raise _error("discovery.no_nodes", "the Ray cluster has no alive nodes")
    labelled = [node for node in alive if NODE_RANK_LABEL in (node.get("Labels") or {})]
    if not labelled and len(alive) == 1:
        return {0: alive[0]}
    if len(labelled) != len(alive):
        unlabelled = [_node_name(node) for node in alive if node not in labelled]
        raise _error(
            "discovery.missing_rank",
            f"Ray nodes {', '.join(unlabelled)} have no '{NODE_RANK_LABEL}' label; start each "
            f"node with `ray start --labels={NODE_RANK_LABEL}=<rank>` so node ranks are known",
        )
    by_rank: dict[int, Mapping[str, Any]] = {}
    for node in alive:
        text = node["Labels"][NODE_RANK_LABEL]
        if not str(text).isdigit():
            problems.append(
                ConfigIssue(
                    "discovery.bad_rank",
                    f"Ray node {_node_name(node)} has {NODE_RANK_LABEL}={text!r}, not a "
                    "non-negative integer",
                )
            )
            continue
        rank = int(text)
        if rank in by_rank:
            problems.append(
                ConfigIssue(
                    "discovery.duplicate_rank",
                    f"Ray nodes {_node_name(by_rank[rank])} and {_node_name(node)} both claim "
                    f"node rank {rank}",
                )
            )
            continue
        by_rank[rank] = node
    missing = sorted(set(range(len(alive))) - set(by_rank))
    if not problems and missing:
        problems.append(
            ConfigIssue(
                "discovery.rank_gap",
                f"node ranks must be 0..{len(alive) - 1} for {len(alive)} alive nodes; "
                f"missing {', '.join(map(str, missing))} (got {sorted(by_rank)})",
            )
        )
    if problems:
        raise ClusterConfigError(problems)
    return by_rank


def node_accelerators(node: Mapping[str, Any]) -> Accelerators | None:
    """Accelerators a Ray node advertises (GPU for NVIDIA/AMD, NPU for Ascend)."""
    resources = node.get("Resources") or {}
    kinds = [
        key[len(_ACCELERATOR_TYPE_PREFIX) :]
        for key in resources
        if key.startswith(_ACCELERATOR_TYPE_PREFIX)
    ]
    kind = kinds[0] if len(kinds) == 1 else None
    if resources.get("GPU"):
        return Accelerators(kind or "GPU", int(resources["GPU"]))
    if resources.get("NPU"):
        return Accelerators(kind or "NPU", int(resources["NPU"]), "ascend")
    return None


def cluster_from_ray_nodes(nodes: Sequence[Mapping[str, Any]]) -> Cluster:
    """An inventory of the live cluster: node ranks, node groups and accelerators."""
    by_rank = ranked_ray_nodes(nodes)
    declarations: list[AcceleratorDeclaration] = []
    run: list[int] = []
    run_accelerators: Accelerators | None = None
    for rank in sorted(by_rank):
        accelerators = node_accelerators(by_rank[rank])
        if run and accelerators == run_accelerators and run[-1] == rank - 1:
            run.append(rank)
            continue
        if run and run_accelerators is not None:
            declarations.append(AcceleratorDeclaration(tuple(run), run_accelerators))
        run, run_accelerators = [rank], accelerators
    if run and run_accelerators is not None:
        declarations.append(AcceleratorDeclaration(tuple(run), run_accelerators))
    members: dict[str, list[int]] = {}
    for rank in sorted(by_rank):
        label = (by_rank[rank].get("Labels") or {}).get(NODE_GROUP_LABEL)
        if label:
            members.setdefault(label, []).append(rank)
    groups = tuple(NodeGroup(label, tuple(ranks)) for label, ranks in members.items())
    cluster = Cluster(len(by_rank), groups, tuple(declarations))
    issues = validate_cluster(cluster)
    if issues:
        raise ClusterConfigError(issues)
    return cluster


def _node_name(node: Mapping[str, Any]) -> str:
    node_id = str(node.get("NodeID", "?"))
    return f"{node_id[:12]} ({node.get('NodeManagerAddress', 'unknown address')})"


def _error(rule: str, message: str) -> ClusterConfigError:
    return ClusterConfigError([ConfigIssue(rule, message)])
