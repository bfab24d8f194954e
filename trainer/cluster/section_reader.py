"""Shape checks for a raw `cluster:` section and its conversion to the typed model.

Each malformed entry becomes an issue and is skipped (or kept without the unreadable part),
so one pass reports every structural problem; the semantic rules run afterwards in
`trainer.cluster.validation`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .errors import IssueCollector, Path
from .model import (
    VISIBILITY_ENV_VARS,
    AcceleratorDeclaration,
    Accelerators,
    Cluster,
    EnvConfig,
    Hardware,
    HardwareConfig,
    NodeGroup,
)
from .placement_spec import ComponentRule, normalize_placement_value, parse_component_placement
from .ranks import RankOutOfRange, RankSyntaxError, parse_rank_list

MAX_NODES = 100_000  # bounds memory for configs from untrusted input (web forms)
MAX_ACCELERATORS_PER_NODE = 1024

_CLUSTER_KEYS = ("num_nodes", "node_groups", "accelerators", "component_placement")
_GROUP_KEYS = (
    "label",
    "node_ranks",
    "env_configs",
    "hardware",
    "accelerators",
    "ignore_hardware",
)
_ENV_KEYS = ("node_ranks", "env_vars", "python_interpreter_path")
_HARDWARE_KEYS = ("type", "configs")
_ACCELERATOR_KEYS = ("type", "count", "vendor")


class SectionReader:
    """Reads a `cluster:` section into a `Cluster`, recording an issue per bad entry."""

    def __init__(self, issues: IssueCollector) -> None:
        self.issues = issues
        self.num_nodes = 0
        # Where each built object came from, so semantic errors name the right list index
        # even when an earlier, malformed entry was skipped.
        self.origins: dict[int, Path] = {}
        # Groups and env configs kept with empty node_ranks because theirs were unreadable
        # (already reported); keeping them lets their other fields still be checked.
        self.unreadable: set[int] = set()
        self.placement_rules: list[ComponentRule] = []

    def _remember(self, built: Any, path: Path) -> Any:
        if built is not None:
            self.origins[id(built)] = path
        return built

    def cluster(self, section: object, path: Path) -> Cluster | None:
        if not isinstance(section, Mapping):
            self.issues.add(
                "cluster.type",
                f"the cluster section must be a mapping, not {type(section).__name__}",
                path,
            )
            return None
        self._unknown_keys(section, _CLUSTER_KEYS, path, "the cluster section")
        num_nodes = self._num_nodes(section, path)
        if num_nodes is None:
            return None
        self.num_nodes = num_nodes
        groups = self._list_of(section, "node_groups", path, self.group)
        declarations = self._list_of(section, "accelerators", path, self.declaration)
        placement = None
        if "component_placement" in section and section["component_placement"] is not None:
            raw = section["component_placement"]
            rules, placement_issues = parse_component_placement(raw, (*path, "component_placement"))
            self.placement_rules = rules
            self.issues.extend(placement_issues)
            if isinstance(raw, Mapping):
                placement = {str(key): normalize_placement_value(v) for key, v in raw.items()}
        return Cluster(num_nodes, tuple(groups), tuple(declarations), placement)

    def _num_nodes(self, section: Mapping[str, Any], path: Path) -> int | None:
        if "num_nodes" not in section:
            self.issues.add(
                "cluster.num_nodes", "num_nodes is required (the number of nodes)", path
            )
            return None
        value = section["num_nodes"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.issues.add(
                "cluster.num_nodes",
                f"num_nodes must be a positive integer, not {value!r}",
                (*path, "num_nodes"),
            )
            return None
        if value > MAX_NODES:
            self.issues.add(
                "cluster.num_nodes",
                f"num_nodes {value} exceeds the supported maximum of {MAX_NODES}",
                (*path, "num_nodes"),
            )
            return None
        return value

    def _list_of(
        self, data: Mapping[str, Any], key: str, path: Path, read: Callable[[object, Path], Any]
    ) -> list[Any]:
        value = data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            self.issues.add(
                f"{key}.type", f"{key} must be a list, not {type(value).__name__}", (*path, key)
            )
            return []
        items = []
        for index, item in enumerate(value):
            built = self._remember(read(item, (*path, key, index)), (*path, key, index))
            if built is not None:
                items.append(built)
        return items

    def _unknown_keys(
        self, data: Mapping[str, Any], allowed: tuple[str, ...], path: Path, what: str
    ) -> None:
        for key in data:
            if key not in allowed:
                self.issues.add(
                    "config.unknown_key",
                    f"unknown key '{key}' in {what}; allowed: {', '.join(allowed)}",
                    (*path, str(key)),
                )

    def _ranks(self, value: object, path: Path, what: str) -> tuple[int, ...] | None:
        try:
            return tuple(parse_rank_list(value, limit=self.num_nodes))
        except RankSyntaxError as error:
            rule = (
                "node_ranks.out_of_range"
                if isinstance(error, RankOutOfRange)
                else "node_ranks.invalid"
            )
            self.issues.add(rule, f"{what}: {error}", path)
            return None

    def group(self, data: object, path: Path) -> NodeGroup | None:
        if not isinstance(data, Mapping):
            self.issues.add("node_group.type", "a node group must be a mapping", path)
            return None
        self._unknown_keys(data, _GROUP_KEYS, path, "a node group")
        label = data.get("label")
        if isinstance(label, int) and not isinstance(label, bool):
            label = str(label)  # `label: 4090` is read as a number by YAML
        if not isinstance(label, str):
            self.issues.add("node_group.label", "a node group needs a string label", path)
            return None
        if "node_ranks" not in data:
            self.issues.add(
                "node_ranks.missing", f"node group '{label}' needs node_ranks (e.g. 0-7)", path
            )
            return None
        ranks = self._ranks(data["node_ranks"], (*path, "node_ranks"), f"node group '{label}'")
        envs = self._list_of(data, "env_configs", path, lambda item, p: self.env(item, p, label))
        hardware = None
        if data.get("hardware") is not None:
            hardware = self.hardware(data["hardware"], (*path, "hardware"), label)
        accelerators = None
        if data.get("accelerators") is not None:
            accelerators = self.accelerators(data["accelerators"], (*path, "accelerators"), label)
        ignore_hardware = data.get("ignore_hardware", False)
        if not isinstance(ignore_hardware, bool):
            self.issues.add(
                "node_group.ignore_hardware",
                f"ignore_hardware of node group '{label}' must be true or false, not "
                f"{ignore_hardware!r}",
                (*path, "ignore_hardware"),
            )
            ignore_hardware = False
        group = NodeGroup(label, ranks or (), tuple(envs), hardware, accelerators, ignore_hardware)
        if ranks is None:
            self.unreadable.add(id(group))
        return group

    def env(self, data: object, path: Path, label: str) -> EnvConfig | None:
        what = f"env_configs of node group '{label}'"
        if not isinstance(data, Mapping):
            self.issues.add("env_config.type", f"each entry of {what} must be a mapping", path)
            return None
        self._unknown_keys(data, _ENV_KEYS, path, f"an entry of {what}")
        if "node_ranks" not in data:
            self.issues.add("node_ranks.missing", f"each entry of {what} needs node_ranks", path)
            return None
        ranks = self._ranks(data["node_ranks"], (*path, "node_ranks"), what)
        env_vars = self.env_vars(data.get("env_vars"), (*path, "env_vars"), what)
        interpreter = data.get("python_interpreter_path")
        if interpreter is not None and not isinstance(interpreter, str):
            self.issues.add(
                "interpreter.type",
                f"python_interpreter_path in {what} must be a path string",
                (*path, "python_interpreter_path"),
            )
            return None
        if env_vars is None:
            return None
        env = EnvConfig(ranks or (), env_vars, interpreter)
        if ranks is None:
            self.unreadable.add(id(env))
        return env

    def env_vars(self, value: object, path: Path, what: str) -> tuple[tuple[str, str], ...] | None:
        if value is None:
            return ()
        if not isinstance(value, list):
            self.issues.add(
                "env_var.format",
                f"env_vars in {what} must be a list of single-key mappings such as "
                "'- GLOO_SOCKET_IFNAME: eth0'",
                path,
            )
            return None
        pairs: list[tuple[str, str]] = []
        ok = True
        for index, item in enumerate(value):
            item_path = (*path, index)
            if not isinstance(item, Mapping) or len(item) != 1:
                self.issues.add(
                    "env_var.format",
                    f"env_vars[{index}] in {what} must be a mapping with exactly one key, "
                    f"like '- GLOO_SOCKET_IFNAME: eth0'; got {item!r}",
                    item_path,
                )
                ok = False
                continue
            ((key, raw),) = item.items()
            if isinstance(raw, int) and not isinstance(raw, bool):
                raw = str(raw)  # OMP_NUM_THREADS: 4 is unambiguous
            if not isinstance(raw, str):
                self.issues.add(
                    "env_var.value",
                    f"env var {key} in {what} must have a string value (quote it); "
                    f"got {type(raw).__name__} {raw!r}",
                    (*item_path, str(key)),
                )
                ok = False
                continue
            pairs.append((str(key), raw))
        return tuple(pairs) if ok else None

    def hardware(self, data: object, path: Path, label: str) -> Hardware | None:
        what = f"the hardware of node group '{label}'"
        if not isinstance(data, Mapping):
            self.issues.add(
                "hardware.type", f"{what} must be a mapping with type and configs", path
            )
            return None
        self._unknown_keys(data, _HARDWARE_KEYS, path, what)
        kind = data.get("type")
        if isinstance(kind, int) and not isinstance(kind, bool):
            kind = str(kind)
        if not isinstance(kind, str) or not kind:
            self.issues.add("hardware.type", f"{what} needs a type such as Franka", path)
            return None
        raw_configs = data.get("configs")
        if not isinstance(raw_configs, list) or not raw_configs:
            self.issues.add(
                "hardware.configs",
                f"{what} needs configs: a non-empty list with one entry per device, each "
                "with its node_rank",
                (*path, "configs"),
            )
            return None
        configs = self._list_of(
            data, "configs", path, lambda item, p: self.hardware_config(item, p, label)
        )
        if len(configs) != len(raw_configs):
            return None
        return Hardware(kind, tuple(configs))

    def hardware_config(self, data: object, path: Path, label: str) -> HardwareConfig | None:
        what = f"a hardware config of node group '{label}'"
        if not isinstance(data, Mapping):
            self.issues.add("hardware.config", f"{what} must be a mapping", path)
            return None
        node_rank = data.get("node_rank")
        if isinstance(node_rank, bool) or not isinstance(node_rank, int):
            self.issues.add(
                "hardware.node_rank", f"{what} needs an integer node_rank", (*path, "node_rank")
            )
            return None
        robot_ip = data.get("robot_ip")
        if robot_ip is not None and not isinstance(robot_ip, str):
            self.issues.add(
                "hardware.robot_ip",
                f"robot_ip in {what} must be a quoted address string",
                (*path, "robot_ip"),
            )
            return None
        serials = data.get("camera_serials")
        if serials is not None:
            if not isinstance(serials, list) or not all(isinstance(s, str) for s in serials):
                # Unquoted serials are read as numbers and lose leading zeros.
                self.issues.add(
                    "hardware.camera_serials",
                    f"camera_serials in {what} must be a list of quoted strings "
                    "(unquoted, 012345 would be read as the number 12345)",
                    (*path, "camera_serials"),
                )
                return None
            serials = tuple(serials)
        extra = {
            str(key): value
            for key, value in data.items()
            if key not in ("node_rank", "robot_ip", "camera_serials")
        }
        return HardwareConfig(node_rank, robot_ip, serials, extra)

    def accelerators(self, data: object, path: Path, owner: str) -> Accelerators | None:
        what = f"accelerators of {owner}"
        if not isinstance(data, Mapping):
            self.issues.add(
                "accelerators.format",
                f"{what} must be a mapping such as {{type: A800, count: 8}}",
                path,
            )
            return None
        self._unknown_keys(data, _ACCELERATOR_KEYS, path, what)
        kind, count, vendor = data.get("type"), data.get("count"), data.get("vendor")
        if isinstance(kind, int) and not isinstance(kind, bool):
            kind = str(kind)  # `type: 4090`
        ok = True
        if not isinstance(kind, str) or not kind:
            self.issues.add("accelerators.type", f"{what} need a type such as A800", path)
            ok = False
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            self.issues.add(
                "accelerators.count",
                f"{what}: count must be a positive integer per node (omit accelerators when "
                f"there are none), not {count!r}",
                (*path, "count"),
            )
            ok = False
        elif count > MAX_ACCELERATORS_PER_NODE:
            self.issues.add(
                "accelerators.count",
                f"{what}: count {count} exceeds {MAX_ACCELERATORS_PER_NODE} per node",
                (*path, "count"),
            )
            ok = False
        if vendor is not None and vendor not in VISIBILITY_ENV_VARS:
            self.issues.add(
                "accelerators.vendor",
                f"{what}: vendor must be one of {', '.join(VISIBILITY_ENV_VARS)}, not {vendor!r}",
                (*path, "vendor"),
            )
            ok = False
        return Accelerators(kind, count, vendor) if ok else None

    def declaration(self, data: object, path: Path) -> AcceleratorDeclaration | None:
        if not isinstance(data, Mapping) or "node_ranks" not in data:
            self.issues.add(
                "accelerators.format",
                "each cluster-level accelerators entry needs node_ranks, type and count, "
                "e.g. {node_ranks: 0-7, type: A800, count: 8}",
                path,
            )
            return None
        ranks = self._ranks(data["node_ranks"], (*path, "node_ranks"), "accelerators")
        rest = {key: value for key, value in data.items() if key != "node_ranks"}
        accelerators = self.accelerators(rest, path, "nodes " + str(data["node_ranks"]))
        if ranks is None or accelerators is None:
            return None
        return AcceleratorDeclaration(ranks, accelerators)
