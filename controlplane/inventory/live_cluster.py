"""A cluster as Ray has it now, beside what its YAML declares: each live Ray node with
its labels, its CPUs and GPUs (total, and held by live actors), the active runs'
processes on it, and the nodes the YAML declares that Ray lacks.

Ray's one cluster (RAY_ADDRESS) serves every cluster of the inventory; a node belongs
to a cluster's YAML by its node-rank label (`./armature join --node-rank N`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from django.conf import settings

from controlplane.inventory.models import Cluster
from controlplane.runs import ray_jobs
from controlplane.runs.models import ACTIVE_STATES, RunEvent
from trainer.cluster import NODE_GROUP_LABEL, NODE_RANK_LABEL

# The page asks again every few seconds: an unanswered Ray must not hold it.
RAY_DEADLINE_S = 3.0


@dataclass
class Process:
    run_id: int
    component: str
    rank: int
    pid: int | None


@dataclass
class LiveNode:
    node_id: str
    ip: str
    is_head: bool
    rank: int | None  # its node-rank label; None when it has none
    group: str  # its node-group label, "" when none
    cpus: float
    cpus_used: float
    gpus: float
    gpus_used: float
    in_yaml: bool  # whether the cluster's YAML declares its rank
    processes: list[Process] = field(default_factory=list)


@dataclass
class MissingNode:
    rank: int
    groups: list[str]


@dataclass
class LiveCluster:
    nodes: list[LiveNode] = field(default_factory=list)
    missing: list[MissingNode] = field(default_factory=list)
    error: str | None = None


def live_cluster(cluster: Cluster) -> LiveCluster:
    """Ray's live nodes laid beside `cluster`'s YAML; `error` says why Ray could not be
    read (the rest is then empty)."""
    try:
        ray_nodes = ray_jobs.live_nodes(timeout_s=RAY_DEADLINE_S)
        actors = ray_jobs.live_actors(timeout_s=RAY_DEADLINE_S)
    except ray_jobs.RayJobsError as error:
        return LiveCluster(error=f"Ray at {settings.RAY_ADDRESS} could not be read: {error}")
    declared = {node.rank: list(node.groups) for node in cluster.nodes.all()}
    used = _held_by_actors(actors)
    nodes = sorted(
        (_live_node(node, used[node.get("node_id", "")], declared) for node in ray_nodes),
        key=lambda node: (node.rank is None, node.rank or 0, node.ip),
    )
    _place_processes(nodes)
    present = {node.rank for node in nodes}
    missing = [MissingNode(rank, groups) for rank, groups in sorted(declared.items())
               if rank not in present]  # fmt: skip
    return LiveCluster(nodes, missing)


def _held_by_actors(actors: list[dict]) -> dict[str, dict[str, float]]:
    held: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for actor in actors:
        for resource, amount in (actor.get("required_resources") or {}).items():
            if isinstance(amount, int | float):
                held[actor.get("node_id", "")][resource] += amount
    return held


def _live_node(node: dict, used: dict[str, float], declared: dict[int, list[str]]) -> LiveNode:
    labels = node.get("labels") or {}
    try:
        rank = int(labels[NODE_RANK_LABEL])
    except (KeyError, TypeError, ValueError):
        rank = None
    total = node.get("resources_total") or {}
    return LiveNode(
        node_id=node.get("node_id", ""),
        ip=node.get("node_ip", ""),
        is_head=bool(node.get("is_head_node")),
        rank=rank,
        group=str(labels.get(NODE_GROUP_LABEL, "")),
        cpus=total.get("CPU", 0),
        cpus_used=used.get("CPU", 0),
        gpus=total.get("GPU", 0),
        gpus_used=used.get("GPU", 0),
        in_yaml=rank in declared,
    )


def _place_processes(nodes: list[LiveNode]) -> None:
    """Put each active run's processes (as its newest `placed` event reports them) on
    the live node with their address and node rank (the address alone when no node
    there has that rank: several nodes may share a machine)."""
    by_address: dict[str, list[LiveNode]] = defaultdict(list)
    for node in nodes:
        by_address[node.ip].append(node)
    for event in _newest_placed_per_active_run():
        for process in event.data.get("processes", []):
            if not isinstance(process, dict):
                continue
            candidates = by_address.get(str(process.get("node_ip", "")), [])
            ranked = [node for node in candidates if node.rank == process.get("node_rank")]
            target = (ranked or candidates or [None])[0]
            if target is not None:
                target.processes.append(
                    Process(
                        event.run_id,
                        str(process.get("component", "")),
                        int(process.get("rank") or 0),
                        process.get("pid"),
                    )  # fmt: skip
                )
    for node in nodes:
        node.processes.sort(key=lambda p: (p.run_id, p.component, p.rank))


def _newest_placed_per_active_run() -> list[RunEvent]:
    newest: dict[int, RunEvent] = {}
    events = RunEvent.objects.filter(kind="placed", run__state__in=ACTIVE_STATES)
    for event in events.order_by("created_at", "pk"):
        newest[event.run_id] = event
    return list(newest.values())
