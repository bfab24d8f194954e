"""Cluster inventory, component placement grammar and its resolution to a plan.

Pure Python (no Ray, no Django): the control plane calls these to validate a cluster and
preview a placement; the runtime turns the resulting `Plan` into Ray actors.
"""

from .config import cluster_from_dict, cluster_to_dict, ensure_valid
from .discovery import NODE_GROUP_LABEL, NODE_RANK_LABEL, cluster_from_ray_nodes
from .errors import ClusterConfigError, ConfigIssue
from .model import (
    AcceleratorDeclaration,
    Accelerators,
    Cluster,
    EnvConfig,
    Hardware,
    HardwareConfig,
    NodeGroup,
    NodeInfo,
)
from .plan import ACCELERATOR, HARDWARE, NODE, Plan, ProcessPlacement
from .resolution import MAX_PROCESSES, PlanTooLarge, resolve_placement
from .validation import validate_cluster
from .yaml_io import (
    dump_cluster_yaml,
    load_cluster_yaml,
    load_placement_yaml,
    resolve_placement_text,
)

__all__ = [
    "ACCELERATOR",
    "HARDWARE",
    "MAX_PROCESSES",
    "PlanTooLarge",
    "NODE",
    "NODE_GROUP_LABEL",
    "NODE_RANK_LABEL",
    "AcceleratorDeclaration",
    "Accelerators",
    "Cluster",
    "ClusterConfigError",
    "ConfigIssue",
    "EnvConfig",
    "Hardware",
    "HardwareConfig",
    "NodeGroup",
    "NodeInfo",
    "Plan",
    "ProcessPlacement",
    "cluster_from_dict",
    "cluster_from_ray_nodes",
    "cluster_to_dict",
    "dump_cluster_yaml",
    "ensure_valid",
    "load_cluster_yaml",
    "load_placement_yaml",
    "resolve_placement",
    "resolve_placement_text",
    "validate_cluster",
]
