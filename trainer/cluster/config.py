"""Import and export of the `cluster:` section (the seed's format) as plain data.

`cluster_from_dict` checks the shape of every entry, builds the typed model, then runs the
semantic rules of `trainer.cluster.validation`; all problems are raised together as one
`ClusterConfigError`. `cluster_to_dict` writes the same format back, so
`cluster_from_dict(cluster_to_dict(c)) == c` (lossless round trip).

Extension to the seed format: accelerators, per node, either on a node group
(`accelerators: {type: A800, count: 8}`) or at cluster level for arbitrary nodes
(`accelerators: [{node_ranks: 0-7, type: A800, count: 8}]`, which is what discovery from a
live Ray cluster produces). `vendor` (nvidia, amd, ascend) is optional, NVIDIA by default.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .errors import ClusterConfigError, IssueCollector, Path
from .model import Accelerators, Cluster, EnvConfig, HardwareConfig, NodeGroup
from .ranks import format_ranks
from .resolution import placement_arithmetic_issues
from .section_reader import read_section
from .validation import validate_cluster


def cluster_from_dict(section: Mapping[str, Any], path: Path = ("cluster",)) -> Cluster:
    """Build a validated `Cluster` from the contents of a `cluster:` section.

    Raises `ClusterConfigError` listing every problem found.
    """
    reading = read_section(section, path)
    issues = IssueCollector(reading.issues)
    cluster = reading.cluster
    if cluster is not None:
        issues.extend(
            validate_cluster(
                cluster, path=path, origins=reading.origins, unreadable_ranks=reading.unreadable
            )
        )
    if issues:
        # The placement cannot be resolved against a broken inventory, but its own
        # arithmetic can be checked now rather than after the next fix.
        issues.extend(placement_arithmetic_issues(reading.placement_rules))
    issues.raise_if_any()
    assert cluster is not None  # no issues implies a cluster was built
    return cluster


def cluster_to_dict(cluster: Cluster) -> dict[str, Any]:
    """The `cluster:` section for `cluster`, in the seed's layout (ranks as range text)."""
    section: dict[str, Any] = {"num_nodes": cluster.num_nodes}
    if cluster.component_placement is not None:
        section["component_placement"] = {
            key: (dict(value) if isinstance(value, Mapping) else value)
            for key, value in cluster.component_placement.items()
        }
    if cluster.node_groups:
        section["node_groups"] = [_group_to_dict(group) for group in cluster.node_groups]
    if cluster.accelerators:
        section["accelerators"] = [
            {
                "node_ranks": format_ranks(entry.node_ranks),
                **_accelerators_to_dict(entry.accelerators),
            }
            for entry in cluster.accelerators
        ]
    return section


def _group_to_dict(group: NodeGroup) -> dict[str, Any]:
    data: dict[str, Any] = {"label": group.label, "node_ranks": format_ranks(group.node_ranks)}
    if group.accelerators is not None:
        data["accelerators"] = _accelerators_to_dict(group.accelerators)
    if group.env_configs:
        data["env_configs"] = [_env_to_dict(env) for env in group.env_configs]
    if group.ignore_hardware:
        data["ignore_hardware"] = True
    if group.hardware is not None:
        data["hardware"] = {
            "type": group.hardware.type,
            "configs": [_hardware_config_to_dict(config) for config in group.hardware.configs],
        }
    return data


def _accelerators_to_dict(accelerators: Accelerators) -> dict[str, Any]:
    data: dict[str, Any] = {"type": accelerators.type, "count": accelerators.count}
    if accelerators.vendor is not None:
        data["vendor"] = accelerators.vendor
    return data


def _env_to_dict(env: EnvConfig) -> dict[str, Any]:
    data: dict[str, Any] = {"node_ranks": format_ranks(env.node_ranks)}
    if env.python_interpreter_path is not None:
        data["python_interpreter_path"] = env.python_interpreter_path
    if env.env_vars:
        data["env_vars"] = [{key: value} for key, value in env.env_vars]
    return data


def _hardware_config_to_dict(config: HardwareConfig) -> dict[str, Any]:
    data: dict[str, Any] = {}
    if config.robot_ip is not None:
        data["robot_ip"] = config.robot_ip
    data["node_rank"] = config.node_rank
    if config.camera_serials is not None:
        data["camera_serials"] = list(config.camera_serials)
    data.update(config.extra)
    return data


def ensure_valid(cluster: Cluster) -> None:
    """Raise `ClusterConfigError` if a cluster built in Python breaks a rule."""
    issues = validate_cluster(cluster)
    if issues:
        raise ClusterConfigError(issues)
