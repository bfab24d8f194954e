"""Writing and reading the inventory: every cluster goes through the trainer's own
validation (`trainer.cluster`) before a row is written."""

import io
from collections.abc import Mapping
from typing import Any

from django.db import transaction
from ruamel.yaml import YAML

from controlplane.inventory.models import Cluster, EnvConfig, Node, NodeGroup, Robot
from trainer import cluster as tc
from trainer.key_paths import with_lines


def import_cluster_yaml(name: str, text: str, description: str | None = None) -> Cluster:
    """Create or replace cluster `name` from YAML text (a `cluster:` section).

    Raises `trainer.cluster.ClusterConfigError` listing every problem (with lines)."""
    return save_cluster(name, tc.load_cluster_yaml(text), description)


# Text columns of the section's entries: (path inside a node group, column's max_length).
GROUP_TEXT_COLUMNS = (
    (("label",), NodeGroup._meta.get_field("label").max_length),
    (("node_ranks",), NodeGroup._meta.get_field("node_ranks").max_length),
    (("accelerators", "type"), NodeGroup._meta.get_field("accelerator_type").max_length),
    (("accelerators", "vendor"), NodeGroup._meta.get_field("accelerator_vendor").max_length),
    (("hardware", "type"), NodeGroup._meta.get_field("hardware_type").max_length),
)
ENV_TEXT_COLUMNS = (
    (("node_ranks",), EnvConfig._meta.get_field("node_ranks").max_length),
    (
        ("python_interpreter_path",),
        EnvConfig._meta.get_field("python_interpreter_path").max_length,
    ),
)
ROBOT_TEXT_COLUMNS = ((("robot_ip",), Robot._meta.get_field("robot_ip").max_length),)


def column_issues(section: dict[str, Any]) -> list[tc.ConfigIssue]:
    """Values longer than the column that stores them (SQLite would keep them, PostgreSQL
    refuses the write), as issues with their key path."""
    issues = []

    def check(entry: dict, columns: tuple, path: tuple) -> None:
        for keys, limit in columns:
            value: Any = entry
            for key in keys:
                value = value.get(key) if isinstance(value, dict) else None
            if isinstance(value, str) and len(value) > limit:
                issues.append(
                    tc.ConfigIssue(
                        "storage.too_long",
                        f"{len(value)} characters; at most {limit} can be stored",
                        (*path, *keys),
                    )
                )

    for index, group in enumerate(section.get("node_groups", [])):
        group_path = ("cluster", "node_groups", index)
        check(group, GROUP_TEXT_COLUMNS, group_path)
        for env_index, env in enumerate(group.get("env_configs", [])):
            check(env, ENV_TEXT_COLUMNS, (*group_path, "env_configs", env_index))
        for robot_index, robot in enumerate((group.get("hardware") or {}).get("configs", [])):
            check(robot, ROBOT_TEXT_COLUMNS, (*group_path, "hardware", "configs", robot_index))
    return issues


def ensure_storable(spec: tc.Cluster) -> None:
    """Raise `ClusterConfigError` (with key paths and YAML lines) for a value longer than
    the column that would store it."""
    issues = column_issues(tc.cluster_to_dict(spec))
    if issues:
        raise tc.ClusterConfigError(with_lines(issues, dict(spec.source_lines)))


@transaction.atomic
def save_cluster(name: str, spec: tc.Cluster, description: str | None = None) -> Cluster:
    """Store a validated trainer cluster under `name`, replacing what was there.

    Raises `ClusterConfigError` for a value longer than its column."""
    ensure_storable(spec)
    section = tc.cluster_to_dict(spec)
    cluster, _ = Cluster.objects.update_or_create(
        name=name,
        defaults={
            "num_nodes": spec.num_nodes,
            "component_placement": section.get("component_placement"),
            "accelerator_declarations": section.get("accelerators", []),
            **({"description": description} if description is not None else {}),
        },
    )
    cluster.node_groups.all().delete()
    cluster.nodes.all().delete()
    for position, group in enumerate(section.get("node_groups", [])):
        _create_group(cluster, position, group)
    Node.objects.bulk_create(
        Node(
            cluster=cluster,
            rank=node.rank,
            groups=[g.label for g in spec.node_groups if node.rank in g.node_ranks],
            accelerator_type=node.accelerators.type if node.accelerators else "",
            accelerator_count=node.num_accelerators,
            env_vars=dict(node.env_vars),
            python_interpreter_path=node.python_interpreter_path,
            python_interpreters=dict(node.python_interpreters),
        )
        for node in spec.nodes
    )
    return cluster


def _create_group(cluster: Cluster, position: int, data: dict[str, Any]) -> None:
    accelerators = data.get("accelerators") or {}
    hardware = data.get("hardware") or {}
    group = NodeGroup.objects.create(
        cluster=cluster,
        position=position,
        label=data["label"],
        node_ranks=data["node_ranks"],
        accelerator_type=accelerators.get("type", ""),
        accelerator_count=accelerators.get("count"),
        accelerator_vendor=accelerators.get("vendor", ""),
        hardware_type=hardware.get("type", ""),
        ignore_hardware=data.get("ignore_hardware", False),
    )
    EnvConfig.objects.bulk_create(
        EnvConfig(
            node_group=group,
            position=index,
            node_ranks=env["node_ranks"],
            env_vars=env.get("env_vars", []),
            python_interpreter_path=env.get("python_interpreter_path"),
        )
        for index, env in enumerate(data.get("env_configs", []))
    )
    known = {"robot_ip", "node_rank", "camera_serials"}
    Robot.objects.bulk_create(
        Robot(
            node_group=group,
            hardware_rank=index,
            node_rank=config["node_rank"],
            robot_ip=config.get("robot_ip"),
            camera_serials=config.get("camera_serials"),
            extra={k: v for k, v in config.items() if k not in known},
        )
        for index, config in enumerate(hardware.get("configs", []))
    )


def to_trainer_cluster(cluster: Cluster) -> tc.Cluster:
    """The trainer's cluster the rows describe, read and validated as any `cluster:`
    section is. The one way back from the rows: exports and launches then write it with
    `trainer.cluster.cluster_to_dict`, the one serialisation.

    Raises `ClusterConfigError` naming every problem by key path when the rows no longer
    form a valid cluster (they can be edited outside `save_cluster`)."""
    section, problems = _stored_section(cluster)
    try:
        spec = tc.cluster_from_dict(section)
    except tc.ClusterConfigError as error:
        problems = [*problems, *error.issues]
    if problems:
        raise tc.ClusterConfigError(problems)
    return spec


def export_cluster_yaml(cluster: Cluster) -> str:
    return tc.dump_cluster_yaml(to_trainer_cluster(cluster))


def editable_cluster_yaml(cluster: Cluster) -> tuple[str, list[tc.ConfigIssue]]:
    """The YAML a stored cluster is edited as, and the problems of its rows. Rows that no
    longer form a valid cluster are given as they are, with their problems, so an editor
    shows what to fix instead of failing."""
    try:
        return export_cluster_yaml(cluster), []
    except tc.ClusterConfigError as error:
        section, _ = _stored_section(cluster)
        stream = io.StringIO()
        YAML(typ="safe", pure=True).dump({"cluster": section}, stream)
        return stream.getvalue(), list(error.issues)


def _stored_section(cluster: Cluster) -> tuple[dict[str, Any], list[tc.ConfigIssue]]:
    """The rows as the `cluster:` section they store, every column under its key for
    the trainer's reader to check (it reports a wrong value by key path, whatever its
    type), and the problems no section can hold."""
    problems: list[tc.ConfigIssue] = []
    groups = []
    for index, group in enumerate(cluster.node_groups.prefetch_related("env_configs", "robots")):
        path = ("cluster", "node_groups", index)
        entry: dict[str, Any] = {"label": group.label, "node_ranks": group.node_ranks}
        if group.accelerator_type:
            entry["accelerators"] = {
                "type": group.accelerator_type,
                "count": group.accelerator_count,
                "vendor": group.accelerator_vendor or None,
            }
        entry["ignore_hardware"] = group.ignore_hardware
        entry["env_configs"] = [
            {
                "node_ranks": env.node_ranks,
                "env_vars": env.env_vars,
                "python_interpreter_path": env.python_interpreter_path,
            }
            for env in group.env_configs.all()
        ]
        if group.hardware_type:
            configs = []
            for rank, robot in enumerate(group.robots.all()):
                extra = robot.extra if isinstance(robot.extra, Mapping) else {}
                if extra is not robot.extra:
                    where = (*path, "hardware", "configs", rank)
                    problems.append(tc.ConfigIssue("storage.invalid", _NOT_A_MAPPING, where))
                known = {"robot_ip": robot.robot_ip, "node_rank": robot.node_rank,
                         "camera_serials": robot.camera_serials}  # fmt: skip
                configs.append({**extra, **known})
            entry["hardware"] = {"type": group.hardware_type, "configs": configs}
        groups.append(entry)
    section = {
        "num_nodes": cluster.num_nodes,
        "node_groups": groups,
        "accelerators": cluster.accelerator_declarations,
        "component_placement": cluster.component_placement,
    }
    return section, problems


_NOT_A_MAPPING = "the stored extra fields of this device are not a mapping"
