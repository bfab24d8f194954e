"""`python -m trainer discover --address HOST:PORT`: print the inventory of a live Ray
cluster (nodes and their accelerators) as a `cluster:` YAML section to import.

Discovery talks to Ray only, and only when asked: robot IPs and cameras are never
probed; add them under a node group's `hardware` by hand.
"""

import argparse
import os
import socket
import sys
from typing import Any

from trainer import cluster as tc


def add_parser(subcommands: Any) -> None:
    parser = subcommands.add_parser(
        "discover",
        help="print a live Ray cluster's nodes and accelerators as a cluster: section",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--address",
        default=os.environ.get("RAY_ADDRESS", "auto"),
        help="Ray cluster address (GCS HOST:PORT or ray://...); default $RAY_ADDRESS or auto",
    )
    parser.set_defaults(handler=main)


def unreachable(address: str, timeout_s: float = 5.0) -> str | None:
    """Why a HOST:PORT address cannot be reached, or None. Ray's own connect retries for
    about a minute; a closed port should fail at once."""
    host, _, port = address.rpartition(":")
    if "://" in address or not host or not port.isdigit():
        return None  # auto, ray://...: left to Ray
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as error:
        return str(error)
    return None


def main(args: argparse.Namespace) -> int:
    import ray  # only this command needs a Ray connection

    problem = unreachable(args.address)
    if problem:
        print(f"error: cannot connect to Ray at {args.address}: {problem}", file=sys.stderr)
        return 2
    if os.environ.get("RAY_AUTH_TOKEN") and not os.environ.get("RAY_AUTH_MODE"):
        os.environ["RAY_AUTH_MODE"] = "token"  # a token means the cluster checks tokens
    try:
        ray.init(address=args.address, logging_level="ERROR", log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as error:
        token = "the one set is not its?" if os.environ.get("RAY_AUTH_TOKEN") else "none is set"
        print(
            f"error: cannot connect to Ray at {args.address}: {error}\n  (a cluster started "
            f"with RAY_AUTH_MODE=token needs its token in RAY_AUTH_TOKEN: {token})",
            file=sys.stderr,
        )
        return 2
    try:
        spec = tc.cluster_from_ray_nodes(ray.nodes())
    except tc.ClusterConfigError as error:
        print("error: " + "\n  - ".join(["cannot build the inventory:", *error.messages]),
              file=sys.stderr)  # fmt: skip
        return 2
    finally:
        ray.shutdown()
    sys.stdout.write(tc.dump_cluster_yaml(spec) + placement_hint(spec.num_nodes))
    return 0


def placement_hint(num_nodes: int) -> str:
    """How to place a run on the discovered nodes, as YAML comments under `cluster:`."""
    nodes = "0" if num_nodes == 1 else f"0-{num_nodes - 1}"
    return (
        "  # Place a run's processes by node rank (docs/placement.md), e.g. one actor rank\n"
        "  # and one env worker per node:\n"
        "  # component_placement:\n"
        f'  #   actor: "{nodes}"\n'
        f'  #   env: "{nodes}"\n'
    )
