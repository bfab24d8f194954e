"""Benchmark: resolve 100,000 processes over a 10,000-node inventory.

Ours is `trainer.cluster.resolve_placement` (cluster validation included). The baseline,
written below, is the straightforward way to do the same job, in the style of RLinf's
`ComponentPlacement`: expand every rank range into lists, map processes to resources with a
dict of lists, then build each process's placement (node, local rank, devices, env) one by
one. Both run in this process on the same inventory; their plans are checked to be equal.
Each is repeated and the median is reported.

    .venv/bin/python bench/placement.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from trainer.cluster import (  # noqa: E402
    Cluster,
    Plan,
    cluster_from_dict,
    resolve_placement,
    validate_cluster,
)

NUM_NODES = 10_000


def inventory() -> dict[str, Any]:
    """4000 A800 nodes and 4000 RTX 4090 nodes (8 GPUs each), 1000 nodes with two Franka
    arms each, 1000 CPU nodes; 32k + 64k + 4k = 100,000 processes."""
    robots = [
        {
            "robot_ip": f"2001:db8::{index:x}",  # documentation prefix: data only
            "node_rank": 8000 + index // 2,
            "camera_serials": [f"{index:012d}"],
        }
        for index in range(2000)
    ]
    return {
        "num_nodes": NUM_NODES,
        "component_placement": {
            "actor": {"node_group": "a800", "placement": "0-31999"},
            "rollout": {"node_group": "4090", "placement": "0-31999:0-63999"},
            "env": {"node_group": "franka", "placement": "0-1999:0-3999"},
        },
        "node_groups": [
            {
                "label": "a800",
                "node_ranks": "0-3999",
                "accelerators": {"type": "A800", "count": 8},
                "env_configs": [
                    {
                        "node_ranks": "0-3999",
                        "python_interpreter_path": "/opt/venv/openpi/bin/python3",
                        "env_vars": [{"GLOO_SOCKET_IFNAME": "eth0"}],
                    }
                ],
            },
            {
                "label": "4090",
                "node_ranks": "4000-7999",
                "accelerators": {"type": "RTX4090", "count": 8},
                "env_configs": [
                    {"node_ranks": "4000-7999", "env_vars": [{"GLOO_SOCKET_IFNAME": "eth1"}]}
                ],
            },
            {
                "label": "franka",
                "node_ranks": "8000-8999",
                "hardware": {"type": "Franka", "configs": robots},
            },
            {"label": "cpu", "node_ranks": "9000-9999"},
        ],
    }


def ours(cluster: Cluster) -> Plan:
    return resolve_placement(cluster)


def ours_rows(plan: Plan) -> list[tuple[Any, ...]]:
    return [
        (
            p.component,
            p.process_rank,
            p.node_rank,
            p.local_rank,
            p.local_world_size,
            p.node_group,
            p.resource_ranks,
            p.local_hardware_ranks,
            p.visible_accelerators,
            dict(p.env_vars),
            p.python_interpreter_path,
        )
        for p in plan.processes
    ]


def baseline_rows(records: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [
        (
            r["component"],
            r["process_rank"],
            r["node_rank"],
            r["local_rank"],
            r["local_world_size"],
            r["node_group"],
            r["resource_ranks"],
            r["local_hardware_ranks"],
            r["visible_accelerators"],
            r["env_vars"],
            r["python_interpreter_path"],
        )
        for r in records
    ]


def baseline(cluster: Cluster) -> list[dict[str, Any]]:
    """The straightforward resolution: same inputs, same checks, the same fields per process.
    Cluster validation is shared code, so both sides include the same call."""
    validate_cluster(cluster)
    # Each group's env vars and interpreter per node (a process gets its group's).
    group_env: dict[tuple[str, int], dict[str, str]] = {}
    group_python: dict[tuple[str, int], str | None] = {}
    node_gpus: dict[int, int] = dict.fromkeys(range(cluster.num_nodes), 0)
    for group in cluster.node_groups:
        for rank in group.node_ranks:
            if group.accelerators is not None:
                node_gpus[rank] = group.accelerators.count
        for env in group.env_configs:
            for rank in env.node_ranks:
                node_env = group_env.setdefault((group.label, rank), {})
                for key, value in env.env_vars:
                    if key in node_env:
                        raise ValueError(f"{key} set twice on node {rank}")
                    node_env[key] = value
                if env.python_interpreter_path:
                    group_python[(group.label, rank)] = env.python_interpreter_path
    records: list[dict[str, Any]] = []
    for component, rule in cluster.component_placement.items():
        group = cluster.group(rule["node_group"])
        # Resource table: global resource rank -> (node, local index, is accelerator).
        table: list[tuple[int, int, bool]] = []
        if group.hardware is not None:
            counts: dict[int, int] = {}
            for config in sorted(group.hardware.configs, key=lambda c: c.node_rank):
                table.append((config.node_rank, counts.get(config.node_rank, 0), False))
                counts[config.node_rank] = counts.get(config.node_rank, 0) + 1
        else:
            for rank in sorted(group.node_ranks):
                for index in range(node_gpus[rank]):
                    table.append((rank, index, True))
        # Parse segments into expanded lists, checking as RLinf does.
        rank_map: list[tuple[list[int], list[int]]] = []
        used_resources: list[int] = []
        used_processes: list[int] = []
        for part in rule["placement"].split(","):
            pieces = part.split(":")
            first, _, last = pieces[0].partition("-")
            resources = list(range(int(first), int(last or first) + 1))
            if not set(resources).isdisjoint(set(used_resources)):
                raise ValueError("resource ranks reused")
            if len(pieces) == 2:
                first, _, last = pieces[1].partition("-")
                processes = list(range(int(first), int(last or first) + 1))
            else:
                start = max(used_processes) + 1 if used_processes else 0
                processes = list(range(start, start + len(resources)))
            if not set(processes).isdisjoint(set(used_processes)):
                raise ValueError("process ranks repeated")
            if len(processes) % len(resources) and len(resources) % len(processes):
                raise ValueError("not a whole multiple")
            used_resources.extend(resources)
            used_processes.extend(processes)
            rank_map.append((resources, processes))
        if sorted(used_processes) != list(range(len(used_processes))):
            raise ValueError("process ranks must be 0..N-1")
        # Process -> resources.
        process_resources: dict[int, list[int]] = {}
        for resources, processes in rank_map:
            if len(resources) >= len(processes):
                width = len(resources) // len(processes)
                for index, process in enumerate(processes):
                    process_resources[process] = resources[index * width : (index + 1) * width]
            else:
                share = len(processes) // len(resources)
                for index, process in enumerate(processes):
                    process_resources.setdefault(process, []).append(resources[index // share])
        # One placement per process.
        on_node: dict[int, list[int]] = {}
        for process in sorted(process_resources):
            entries = [table[resource] for resource in process_resources[process]]
            nodes = {entry[0] for entry in entries}
            if len(nodes) != 1:
                raise ValueError("a process spans nodes")
            on_node.setdefault(entries[0][0], []).append(process)
        local_rank = {p: i for procs in on_node.values() for i, p in enumerate(procs)}
        for process in sorted(process_resources):
            entries = [table[resource] for resource in process_resources[process]]
            node = entries[0][0]
            env = dict(group_env.get((group.label, node), {}))
            if entries[0][2]:  # on accelerators: its own
                visible = tuple(entry[1] for entry in entries)
            else:  # on robots: every accelerator of the node, none declared: no variable
                visible = tuple(range(node_gpus[node]))
            if entries[0][2] or visible:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(index) for index in visible)
            records.append(
                {
                    "component": component,
                    "process_rank": process,
                    "node_rank": node,
                    "local_rank": local_rank[process],
                    "local_world_size": len(on_node[node]),
                    "node_group": group.label,
                    "resource_ranks": tuple(process_resources[process]),
                    "local_hardware_ranks": tuple(entry[1] for entry in entries),
                    "visible_accelerators": visible,
                    "env_vars": env,
                    "python_interpreter_path": group_python.get((group.label, node)),
                }
            )
    return records


def median_seconds(function: Any, cluster: Cluster, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function(cluster)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    cluster = cluster_from_dict(inventory())
    our_result, baseline_result = ours_rows(ours(cluster)), baseline_rows(baseline(cluster))
    assert len(our_result) == 100_000, len(our_result)
    assert our_result == baseline_result, "ours and the baseline disagree"
    ours_s = median_seconds(ours, cluster, args.repeats)
    baseline_s = median_seconds(baseline, cluster, args.repeats)
    print(f"inventory: {NUM_NODES} nodes, {len(our_result)} processes, {args.repeats} repeats")
    print(f"ours (resolve_placement): median {ours_s:.3f} s")
    print(f"baseline (straightforward): median {baseline_s:.3f} s")
    print(f"target: ours under 1 s -> {'met' if ours_s < 1 else 'MISSED'}")
    print(
        f"RESULT bench=placement ours={ours_s:.4f} baseline={baseline_s:.4f} "
        f"ratio={ours_s / baseline_s:.3f} unit=s better=lower"
    )


if __name__ == "__main__":
    main()
