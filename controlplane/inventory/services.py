"""Writing and reading the inventory: every cluster goes through the trainer's own
validation (`trainer.cluster`) before a row is written."""

from typing import Any

from django.db import transaction

from controlplane.inventory.models import Cluster, EnvConfig, Node, NodeGroup, Robot
from trainer import cluster as tc
from trainer.cluster.errors import with_lines


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


def cluster_section(cluster: Cluster) -> dict[str, Any]:
    """The `cluster:` section the rows describe (the inverse of `save_cluster`)."""
    section: dict[str, Any] = {"num_nodes": cluster.num_nodes}
    if cluster.component_placement is not None:
        section["component_placement"] = cluster.component_placement
    groups = cluster.node_groups.prefetch_related("env_configs", "robots")
    if groups:
        section["node_groups"] = [_group_section(group) for group in groups]
    if cluster.accelerator_declarations:
        section["accelerators"] = cluster.accelerator_declarations
    return section


def _group_section(group: NodeGroup) -> dict[str, Any]:
    data: dict[str, Any] = {"label": group.label, "node_ranks": group.node_ranks}
    if group.accelerator_type:
        data["accelerators"] = {"type": group.accelerator_type, "count": group.accelerator_count}
        if group.accelerator_vendor:
            data["accelerators"]["vendor"] = group.accelerator_vendor
    if group.ignore_hardware:
        data["ignore_hardware"] = True
    envs = list(group.env_configs.all())
    if envs:
        data["env_configs"] = [_env_section(env) for env in envs]
    if group.hardware_type:
        data["hardware"] = {
            "type": group.hardware_type,
            "configs": [_robot_section(robot) for robot in group.robots.all()],
        }
    return data


def _env_section(env: EnvConfig) -> dict[str, Any]:
    data: dict[str, Any] = {"node_ranks": env.node_ranks}
    if env.python_interpreter_path is not None:
        data["python_interpreter_path"] = env.python_interpreter_path
    if env.env_vars:
        data["env_vars"] = env.env_vars
    return data


def _robot_section(robot: Robot) -> dict[str, Any]:
    data: dict[str, Any] = {"node_rank": robot.node_rank}
    if robot.robot_ip is not None:
        data["robot_ip"] = robot.robot_ip
    if robot.camera_serials is not None:
        data["camera_serials"] = robot.camera_serials
    data.update(robot.extra)
    return data


def to_trainer_cluster(cluster: Cluster) -> tc.Cluster:
    return tc.cluster_from_dict(cluster_section(cluster))


def export_cluster_yaml(cluster: Cluster) -> str:
    return tc.dump_cluster_yaml(to_trainer_cluster(cluster))
