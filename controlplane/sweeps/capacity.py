"""What a sweep's trials hold alone: two runs of one frozen config placed on the same
accelerators or driving the same arms cannot run at once (the second would wait for
the first's devices, or two learners would drive one arm), so such a sweep runs one
trial at a time. Runs not placed on devices share the cluster's CPUs through Ray, which
queues what does not fit."""

from __future__ import annotations

from typing import Any

from trainer.cluster import ACCELERATOR, HARDWARE, cluster_from_dict, resolve_placement
from trainer.config.loading import parse_yaml


def exclusive_devices(frozen_yaml: str) -> list[str]:
    """The devices every run of `frozen_yaml` (a run's frozen config) holds, as people
    read them: "accelerator 0 of node 1", "hardware 0 of node 0", "arm franka-0"."""
    data: dict[str, Any] = parse_yaml(frozen_yaml) or {}
    held = []
    env = data.get("env") or {}
    if env.get("name") == "real_robot":
        robots = (env.get("real_robot") or {}).get("robots") or []
        held += [f"arm {robot.get('name') or f'arm-{i}'}" for i, robot in enumerate(robots)]
    section = data.get("cluster") or {}
    if section.get("component_placement"):
        plan = resolve_placement(cluster_from_dict(section), section["component_placement"])
        for process in plan.processes:
            if process.resource_kind in (ACCELERATOR, HARDWARE):
                held += [f"{process.resource_kind} {rank} of node {process.node_rank}"
                         for rank in process.local_hardware_ranks]  # fmt: skip
    return list(dict.fromkeys(held))
