"""The placement preview: a grid of nodes × resources, each cell listing the components
and process ranks placed on it, or the placement's errors."""

from collections import defaultdict
from dataclasses import dataclass, field

from trainer import cluster as tc
from trainer.cluster.ranks import format_ranks

# Nodes and cells drawn at most; a bigger cluster is summarised rather than drawn whole.
MAX_NODES_DRAWN = 200
MAX_CELLS_DRAWN = 4096
# Processes a preview resolves at most (the page and POST /api/v1/placement/preview):
# beyond, it answers the count per component and this limit, never the plan. Resolving
# stops counting before it builds a process, so the work stays bounded too.
MAX_PREVIEW_PROCESSES = 10_000


@dataclass
class Assignment:
    component: str
    color: int
    ranks: str


@dataclass
class Cell:
    kind: str  # accelerator | robot | node
    label: str
    assignments: list[Assignment] = field(default_factory=list)


@dataclass
class GridRow:
    node_rank: int
    groups: list[str]
    cells: list[Cell]


@dataclass
class PlacementPreview:
    rows: list[GridRow] = field(default_factory=list)
    components: dict[str, dict] = field(default_factory=dict)  # name -> color, processes
    errors: list[dict] = field(default_factory=list)
    hidden_nodes: int = 0

    @property
    def error_lines(self) -> set[int]:
        return {error["line"] for error in self.errors if error.get("line")}


def preview_plan(spec: tc.Cluster, placement: str | dict | None) -> tc.Plan:
    """The plan a preview shows: `placement` (YAML text, a mapping, or None: the
    cluster's own) on `spec`, within the preview's process limit."""
    if isinstance(placement, str):
        return tc.resolve_placement_text(spec, placement, max_processes=MAX_PREVIEW_PROCESSES)
    return tc.resolve_placement(spec, placement, max_processes=MAX_PREVIEW_PROCESSES)


def preview_placement(spec: tc.Cluster, placement: str | dict | None) -> PlacementPreview:
    """Resolve `placement` (as `preview_plan` takes it; blank text: the cluster's own)
    and lay the result out as a grid."""
    if isinstance(placement, str) and not placement.strip():
        placement = None
    try:
        plan = preview_plan(spec, placement)
    except tc.ClusterConfigError as error:
        rows = _grid(spec, {})
        errors = [issue.to_dict() for issue in error.issues]
        return PlacementPreview(rows=rows, errors=errors, hidden_nodes=spec.num_nodes - len(rows))
    colors = {name: index for index, name in enumerate(plan.components)}
    ranks_by_cell: dict[tuple, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for process in plan.processes:
        for key in _cell_keys(process):
            ranks_by_cell[key][process.component].append(process.process_rank)
    assignments = {
        key: [
            Assignment(component, colors[component], format_ranks(ranks))
            for component, ranks in by_component.items()
        ]
        for key, by_component in ranks_by_cell.items()
    }
    preview = PlacementPreview(
        rows=_grid(spec, assignments),
        components={
            name: {"color": colors[name], "processes": len(processes)}
            for name, processes in plan.components.items()
        },
    )
    preview.hidden_nodes = spec.num_nodes - len(preview.rows)
    return preview


def _cell_keys(process: tc.ProcessPlacement) -> list[tuple]:
    node = process.node_rank
    if process.resource_kind == tc.ACCELERATOR:
        return [(node, "accelerator", index) for index in process.local_hardware_ranks]
    if process.resource_kind == tc.HARDWARE:
        return [(node, "robot", process.node_group, i) for i in process.local_hardware_ranks]
    return [(node, "node")]


def _grid(spec: tc.Cluster, assignments: dict[tuple, list[Assignment]]) -> list[GridRow]:
    rows: list[GridRow] = []
    cells_drawn = 0
    for node in spec.nodes[:MAX_NODES_DRAWN]:
        cells_drawn += 1 + node.num_accelerators
        if rows and cells_drawn > MAX_CELLS_DRAWN:
            break
        rank = node.rank
        cells = [Cell("node", f"node {rank}", assignments.get((rank, "node"), []))]
        if node.accelerators is not None:
            cells += [
                Cell(
                    "accelerator",
                    f"{node.accelerators.type} {index}",
                    assignments.get((rank, "accelerator", index), []),
                )
                for index in range(node.accelerators.count)
            ]
        groups = [g for g in spec.node_groups if rank in g.node_ranks]
        for group in groups:
            if group.hardware is None:
                continue
            on_node = [c for c in group.hardware.configs if c.node_rank == rank]
            cells += [
                Cell(
                    "robot",
                    f"{group.hardware.type} {group.label}/{index}"
                    + (f" · {config.robot_ip}" if config.robot_ip else ""),
                    assignments.get((rank, "robot", group.label, index), []),
                )
                for index, config in enumerate(on_node)
            ]
        rows.append(GridRow(rank, [g.label for g in groups], cells))
    return rows
