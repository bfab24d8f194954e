"""`python -m trainer placement CLUSTER.yaml [--json]`: print the resolved placement plan.

Exit status 0 with the plan, 2 with every problem when the file or config is invalid.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from .errors import ClusterConfigError
from .plan import ACCELERATOR, HARDWARE, NODE, Plan, ProcessPlacement
from .ranks import format_ranks
from .resolution import resolve_placement
from .yaml_io import load_cluster_yaml

EXIT_INVALID = 2


def add_parser(subcommands: Any) -> None:
    """Register the `placement` subcommand on an argparse subparsers object."""
    parser = subcommands.add_parser(
        "placement",
        help="resolve a cluster's component placement and print the plan",
        description="Resolve cluster.component_placement of a cluster YAML file and print "
        "where every process runs. Exits with status 2 and lists every problem when the "
        "config is invalid.",
    )
    parser.add_argument("cluster_file", metavar="CLUSTER.yaml", help="YAML with a cluster: section")
    parser.add_argument("--json", action="store_true", help="print the plan (or errors) as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace, out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        with open(args.cluster_file, encoding="utf-8") as handle:
            text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        message = f"cannot read {args.cluster_file}: {error}"
        if args.json:
            json.dump(
                {"ok": False, "errors": [{"rule": "file.unreadable", "message": message}]},
                out,
                indent=2,
            )
            out.write("\n")
        else:
            err.write(f"error: {message}\n")
        return EXIT_INVALID
    try:
        plan = resolve_placement(load_cluster_yaml(text))
    except ClusterConfigError as error:
        if args.json:
            json.dump({"ok": False, "errors": error.to_list()}, out, indent=2)
            out.write("\n")
        else:
            count = len(error.issues)
            err.write(
                f"error: {count} problem{'s' if count != 1 else ''} in {args.cluster_file}:\n"
            )
            for message in error.messages:
                err.write(f"  - {message}\n")
        return EXIT_INVALID
    if args.json:
        json.dump({"ok": True, "plan": plan.to_dict()}, out, indent=2)
        out.write("\n")
    else:
        out.write(format_plan(plan))
    return 0


def format_plan(plan: Plan) -> str:
    """A readable table, one row per process, then each node's environment."""
    headers = (
        "component",
        "rank",
        "node",
        "local",
        "group",
        "resources",
        "node-local",
        "visible devices",
        "interpreter",
    )
    rows = [_row(process) for process in plan.processes]
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows, strict=True)]
    lines = [
        "  ".join(str(cell).ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in (headers, tuple("-" * width for width in widths), *rows)
    ]
    summary = ", ".join(f"{name}: {len(processes)}" for name, processes in plan.components.items())
    lines += ["", f"{plan.cluster.num_nodes} nodes; processes per component: {summary}"]
    lines += [
        "",
        "env vars and interpreter by node group (a process gets those of the group it is placed",
        "through; through 'node' or 'cluster', all those of its node's groups):",
    ]
    configured = False
    for group in plan.cluster.node_groups:
        for env in group.env_configs:
            configured = True
            settings = [f"{key}={value}" for key, value in env.env_vars]
            if env.python_interpreter_path:
                settings.append(f"python={env.python_interpreter_path}")
            noun = "node" if len(env.node_ranks) == 1 else "nodes"
            lines.append(
                f"  {group.label} {noun} {format_ranks(env.node_ranks)}: "
                + (" ".join(settings) or "(none)")
            )
    if not configured:
        lines.append("  (none)")
    return "\n".join(lines) + "\n"


def _row(process: ProcessPlacement) -> tuple[str, ...]:
    if process.resource_kind == HARDWARE:
        noun = process.hardware_type or "hardware"
    elif process.resource_kind == NODE:
        noun = "node"
    else:
        noun = process.hardware_type or "accelerator"
    visible = next(
        (
            f"{key}={value}" if value else f'{key}="" (none)'
            for key, value in process.env_vars.items()
            if key.endswith("VISIBLE_DEVICES")
        ),
        "(node's own)",  # no accelerator declared on the node: nothing is hidden
    )
    if process.resource_kind != ACCELERATOR and process.visible_accelerators:
        visible += " (all)"  # placed per node or on hardware: sees the whole node
    return (
        process.component,
        str(process.process_rank),
        str(process.node_rank),
        f"{process.local_rank}/{process.local_world_size}",
        process.node_group,
        f"{noun} {format_ranks(process.resource_ranks)}",
        format_ranks(process.local_hardware_ranks) or "-",
        visible,
        process.python_interpreter_path or "-",
    )
