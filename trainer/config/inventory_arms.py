"""A `real_robot` env's arms and the cluster's inventory.

Every hardware entry of type Franka in `cluster.node_groups` declares an arm: its
`robot_ip` is the SERL server's host, its other keys the arm's (`safety_box`, `port`,
`action_scale`, `control_hz`, `cameras`, ...: the keys of `env.real_robot.robots`), so
a lab describes each arm once, where it is plugged in, with the limits its admin set.

When `env.real_robot.robots` lists none, the declared arms are the env's arms. An arm
the env lists that the inventory declares (the same server address) is bound to the
inventory's limits (`bind_to_inventory`): the env may shrink its safety box, never widen
it; its control rate and action scale are capped by the inventory's; its cameras are the
inventory's or a subset of them; it homes its joints only where the inventory lets it.
Runs the control plane launches also refuse an address the inventory does not declare;
the standalone CLI may name its own arms (it is the user's own machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError

from trainer.cluster import Cluster
from trainer.config.addresses import robot_base_url
from trainer.config.errors import ConfigError, ConfigIssue
from trainer.config.schema import ExperimentConfig, RobotConfig, SafetyBoxConfig
from trainer.key_paths import KeyPath

ARM_TYPES = {"franka"}  # what SERL's robot server drives
_ROBOTS = ("env", "real_robot", "robots")
_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class DeclaredArm:
    """An arm of the inventory: its settings and the cluster that declares it."""

    robot: RobotConfig
    cluster: str = "the cluster"


def declared_arms(
    cluster: Cluster | None, *, name: str = "the cluster"
) -> tuple[list[DeclaredArm], list[ConfigIssue]]:
    """The arms `cluster` (called `name` in messages) declares, and the problems of its
    entries at their paths under `cluster`."""
    arms: list[DeclaredArm] = []
    problems: list[ConfigIssue] = []
    for group_index, group in enumerate(cluster.node_groups if cluster is not None else ()):
        hardware = group.hardware
        if hardware is None or hardware.type.lower() not in ARM_TYPES:
            continue
        for index, entry in enumerate(hardware.configs):
            at = ("cluster", "node_groups", group_index, "hardware", "configs", index)
            fields: dict[str, Any] = {"name": f"franka-{entry.node_rank}-{index}",
                                      "robot_ip": entry.robot_ip, **entry.extra}  # fmt: skip
            fields.pop("camera_serials", None)  # RealSense serials: not URL cameras
            try:
                arms.append(DeclaredArm(RobotConfig.model_validate(fields), name))
            except ValidationError as error:
                problems += [
                    ConfigIssue(f"config.{issue['type']}", str(issue["msg"]), (*at, *issue["loc"]))
                    for issue in error.errors()
                ]
    return arms, problems


def with_inventory_arms(
    config: ExperimentConfig, cluster: Cluster | None
) -> tuple[ExperimentConfig, list[ConfigIssue]]:
    """`config` with its arms taken from `cluster` where it names none, or its listed
    arms bound to the limits `cluster` declares for them; and the problems, at their
    paths."""
    if config.env.name != "real_robot" or cluster is None:
        return config, []
    arms, problems = declared_arms(cluster)
    if config.env.real_robot.robots:
        try:
            return bind_to_inventory(config, arms, refuse_undeclared=False), problems
        except ConfigError as error:
            return config, problems + error.problems
    if not arms and not problems:
        problems.append(ConfigIssue(
            "env.real_robot.no_arms",
            "env.real_robot.robots lists no arm and the cluster has no hardware of type "
            "Franka",
            _ROBOTS,
        ))  # fmt: skip
    return _with_robots(config, [arm.robot for arm in arms]), problems


def bind_to_inventory(
    config: ExperimentConfig, arms: list[DeclaredArm], *, refuse_undeclared: bool
) -> ExperimentConfig:
    """`config` with each listed arm that `arms` declares bound to its declared limits;
    with `refuse_undeclared`, an arm whose address none declares is a problem. Raises
    ConfigError naming every problem at its key path."""
    if config.env.name != "real_robot":
        return config
    by_address = {robot_address(arm.robot): arm for arm in arms}
    robots, problems, taken = [], [], {}
    for index, robot in enumerate(config.env.real_robot.robots):
        at = (*_ROBOTS, index)
        address = robot_address(robot)
        arm = by_address.get(address)
        if arm is None:
            if refuse_undeclared:
                problems.append(_undeclared(robot, at, address, arms))
            robots.append(robot)
            continue
        if address in taken:
            problems.append(ConfigIssue(
                "env.real_robot.arm_twice",
                f"{address} is already arm {taken[address]} of this list: one arm, one "
                "env copy",
                (*at, _address_key(robot)),
            ))  # fmt: skip
        taken[address] = index
        bound, arm_problems = _bound(robot, arm, at)
        robots.append(bound)
        problems += arm_problems
    if problems:
        raise ConfigError(problems)
    return _with_robots(config, robots)


def robot_address(robot: RobotConfig) -> str:
    """The SERL server an arm's settings reach, written one way whatever form named it
    (`url`, or `robot_ip` and `port`): scheme://host:port/path."""
    return _origin(robot.url or robot_base_url(robot.robot_ip or "", robot.port), path=True)


def _origin(url: str, *, path: bool = False) -> str:
    try:
        parts = urlsplit(url.strip())
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:  # a port that is not a number: matches nothing declared
        return url
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    tail = parts.path.rstrip("/") if path else ""
    return f"{parts.scheme.lower()}://{host}:{port}{tail}"


def _bound(
    robot: RobotConfig, arm: DeclaredArm, at: KeyPath
) -> tuple[RobotConfig, list[ConfigIssue]]:
    """`robot` within `arm`'s declared limits, and what cannot be made to fit."""
    declared = arm.robot
    box, problems = _shrunk_box(robot.safety_box, declared.safety_box, (*at, "safety_box"))
    allowed = {_origin(camera.url) for camera in declared.cameras}
    for index, camera in enumerate(robot.cameras):
        if _origin(camera.url) not in allowed:
            problems.append(ConfigIssue(
                "env.real_robot.undeclared_camera",
                f"camera {camera.name!r} is not one {arm.cluster} declares for this arm; "
                "use one of its cameras (or none to get them all)",
                (*at, "cameras", index, "url"),
            ))  # fmt: skip
    scale = zip(robot.action_scale, declared.action_scale, strict=True)
    bound = robot.model_copy(update={
        "safety_box": box,
        "control_hz": min(robot.control_hz, declared.control_hz),
        "action_scale": [min(a, b) for a, b in scale],
        "joint_reset": robot.joint_reset and declared.joint_reset,
        "cameras": robot.cameras or declared.cameras,
    })  # fmt: skip
    return bound, problems


def _shrunk_box(
    asked: SafetyBoxConfig, declared: SafetyBoxConfig, at: KeyPath
) -> tuple[SafetyBoxConfig, list[ConfigIssue]]:
    """The part of the `asked` box inside the `declared` one; a problem per axis where
    they do not meet."""
    fields: dict[str, list[float]] = {}
    problems = []
    for low, high in (("xyz_low", "xyz_high"), ("rpy_low", "rpy_high")):
        pairs = zip(getattr(asked, low), getattr(declared, low), strict=True)
        lows = [max(a, d) for a, d in pairs]
        pairs = zip(getattr(asked, high), getattr(declared, high), strict=True)
        highs = [min(a, d) for a, d in pairs]
        for axis, (lo, hi) in enumerate(zip(lows, highs, strict=True)):
            if lo > hi:
                problems.append(ConfigIssue(
                    "env.real_robot.box_outside",
                    f"[{getattr(asked, low)[axis]}, {getattr(asked, high)[axis]}] lies outside "
                    f"the inventory's [{getattr(declared, low)[axis]}, "
                    f"{getattr(declared, high)[axis]}]: the box may shrink, never move out",
                    (*at, low, axis),
                ))  # fmt: skip
        fields[low], fields[high] = lows, highs
    return SafetyBoxConfig(**fields), problems


def _undeclared(
    robot: RobotConfig, at: KeyPath, address: str, arms: list[DeclaredArm]
) -> ConfigIssue:
    known = ", ".join(sorted(robot_address(arm.robot) for arm in arms)) or "none"
    return ConfigIssue(
        "env.real_robot.undeclared_arm",
        f"{address} is not an arm of the inventory (declared: {known}); an admin adds arms "
        "to a cluster's hardware (type Franka)",
        (*at, _address_key(robot)),
    )


def _address_key(robot: RobotConfig) -> str:
    return "url" if robot.url else "robot_ip"


def _with_robots(config: ExperimentConfig, robots: list[RobotConfig]) -> ExperimentConfig:
    real = config.env.real_robot.model_copy(update={"robots": robots})
    env = config.env.model_copy(update={"real_robot": real})
    return config.model_copy(update={"env": env})
