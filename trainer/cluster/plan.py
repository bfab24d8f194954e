"""The result of resolving a placement: where every process of every component runs."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from .model import Cluster, HardwareConfig

# What a process's resource ranks count.
ACCELERATOR = "accelerator"
HARDWARE = "hardware"  # e.g. robot arms declared under a group's `hardware`
NODE = "node"  # the node itself: groups without accelerators, and the reserved `node` group


@dataclass(slots=True)
class ProcessPlacement:
    """One process of one component.

    `resource_ranks` are the ranks as written in the placement (numbered within the node
    group, or across the listed groups); `local_hardware_ranks` are the same resources'
    indices on the node (GPU index, or robot index among the group's robots on that node).
    `env_vars` is the process's environment plus the accelerator-visibility variable set to
    `visible_accelerators`: its own devices when placed on accelerators; every accelerator
    of its node otherwise (as RLinf does: simulators and robot drivers may render on them),
    none when its component sets `hide_accelerators`. A process not placed on accelerators,
    on a node with none declared, gets no visibility variable.
    """

    component: str
    process_rank: int
    node_rank: int
    local_rank: int
    local_world_size: int
    node_group: str
    resource_kind: str
    hardware_type: str | None
    resource_ranks: tuple[int, ...]
    local_hardware_ranks: tuple[int, ...]
    visible_accelerators: tuple[int, ...]
    env_vars: Mapping[str, str]  # read-only; shared by processes on the same resources
    python_interpreter_path: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "component": self.component,
            "process_rank": self.process_rank,
            "node_rank": self.node_rank,
            "local_rank": self.local_rank,
            "local_world_size": self.local_world_size,
            "node_group": self.node_group,
            "resource_kind": self.resource_kind,
            "hardware_type": self.hardware_type,
            "resource_ranks": list(self.resource_ranks),
            "local_hardware_ranks": list(self.local_hardware_ranks),
            "visible_accelerators": list(self.visible_accelerators),
            "env_vars": dict(self.env_vars),
            "python_interpreter_path": self.python_interpreter_path,
        }


@dataclass
class Plan:
    """All processes, grouped by component in placement order, each sorted by process rank."""

    cluster: Cluster
    components: dict[str, list[ProcessPlacement]]

    @property
    def processes(self) -> Iterator[ProcessPlacement]:
        for processes in self.components.values():
            yield from processes

    def world_size(self, component: str) -> int:
        return len(self.components[component])

    def process(self, component: str, process_rank: int) -> ProcessPlacement:
        return self.components[component][process_rank]

    def hardware_configs(self, process: ProcessPlacement) -> tuple[HardwareConfig, ...]:
        """The hardware entries (robot IP, cameras...) a hardware-placed process drives."""
        if process.resource_kind != HARDWARE:
            return ()
        group = self.cluster.group(process.node_group)
        if group is None or group.hardware is None:
            return ()
        on_node = [c for c in group.hardware.configs if c.node_rank == process.node_rank]
        return tuple(on_node[index] for index in process.local_hardware_ranks)

    def to_dict(self) -> dict[str, Any]:
        return {
            "num_nodes": self.cluster.num_nodes,
            "components": {
                name: {
                    "world_size": len(processes),
                    "processes": [process.to_dict() for process in processes],
                }
                for name, processes in self.components.items()
            },
        }
