"""A `real_robot` env's arms from the cluster's inventory: when `env.real_robot.robots`
lists none, every hardware entry of type Franka in `cluster.node_groups` is an arm. An
entry's `robot_ip` is the SERL server's host; its other keys are the arm's
(`safety_box`, `port`, `action_scale`, `control_hz`, `cameras`, ...: the keys of
`env.real_robot.robots`), so a lab describes each arm once, where it is plugged in."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from trainer.cluster import Cluster
from trainer.config.errors import ConfigIssue
from trainer.config.schema import ExperimentConfig, RobotConfig

ARM_TYPES = {"franka"}  # what SERL's robot server drives


def with_inventory_arms(
    config: ExperimentConfig, cluster: Cluster | None
) -> tuple[ExperimentConfig, list[ConfigIssue]]:
    """`config` with its arms taken from `cluster` where it names none, and the
    problems of the inventory's entries, at their paths under `cluster`."""
    real = config.env.real_robot
    if config.env.name != "real_robot" or real.robots or cluster is None:
        return config, []
    robots, problems = [], []
    for group_index, group in enumerate(cluster.node_groups):
        hardware = group.hardware
        if hardware is None or hardware.type.lower() not in ARM_TYPES:
            continue
        for index, entry in enumerate(hardware.configs):
            where = ("cluster", "node_groups", group_index, "hardware", "configs", index)
            fields: dict[str, Any] = {"name": f"franka-{entry.node_rank}-{index}",
                                      "robot_ip": entry.robot_ip, **entry.extra}  # fmt: skip
            fields.pop("camera_serials", None)  # RealSense serials: not URL cameras
            try:
                robots.append(RobotConfig.model_validate(fields))
            except ValidationError as error:
                problems += [
                    ConfigIssue(
                        f"config.{issue['type']}", str(issue["msg"]), (*where, *issue["loc"])
                    )  # fmt: skip
                    for issue in error.errors()
                ]
    if not robots and not problems:
        problems.append(ConfigIssue(
            "env.real_robot.no_arms",
            "env.real_robot.robots lists no arm and the cluster has no hardware of type "
            "Franka",
            ("env", "real_robot", "robots"),
        ))  # fmt: skip
    env = config.env.model_copy(update={"real_robot": real.model_copy(update={"robots": robots})})
    return config.model_copy(update={"env": env}), problems
