"""Load an experiment config from YAML plus ``key=value`` overrides and validate it.

YAML is read as YAML 1.2 (ruamel.yaml): PyYAML's YAML 1.1 would turn a placement such
as ``1:2`` into the base-60 integer 62. It is read within the size, alias and depth
limits of `trainer.bounded_yaml`, like every YAML from users. Override values use the
same parser, so ``algorithm.name=grpo``, ``rollout.action_horizons_pattern=[5,10,15]`` and
``algorithm.target_kl=null`` all mean what they say.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from trainer.bounded_yaml import YamlLimitError, load_bounded
from trainer.cluster import (
    Cluster,
    ClusterConfigError,
    Plan,
    cluster_from_dict,
    resolve_placement,
)
from trainer.config.env_defaults import LIBERO_SUITE_MAX_STEPS
from trainer.config.env_shards import assign_env_shards
from trainer.config.errors import ConfigError, ConfigIssue
from trainer.config.inventory_arms import with_inventory_arms
from trainer.config.key_suggestions import closest_key
from trainer.config.schema import ExperimentConfig

_KEY_PART = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)((?:\[\d+\])*)$")
_OVERRIDE = "override.invalid"
_INSIDE_A_VALUE = "cannot set a key inside a non-mapping value"
_TYPE = "config.type"
_STAGES, _STAGES_PATH = "rollout.pipeline_stages", ("rollout", "pipeline_stages")


def parse_yaml(text: str, source: str = "config") -> Any:
    """Parse user YAML within the limits of `trainer.bounded_yaml`; raise `ConfigError`."""
    try:
        return load_bounded(text)
    except YamlLimitError as error:
        mark = error.problem_mark
        problem = ConfigIssue("yaml.limit", f"{source} is refused: {_located(error)}",
                              line=mark.line + 1 if mark is not None else None)  # fmt: skip
        raise ConfigError([problem]) from None
    except YAMLError as error:
        raise ConfigError([_problem(source, "is not valid YAML", error)]) from None


def _problem(source: str, what: str, error: YAMLError) -> ConfigIssue:
    """The problem with the line the YAML error points at, so the editor can mark it."""
    mark = getattr(error, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    return ConfigIssue("yaml.syntax", f"{source} {what}: {error}", line=line)


def _located(error: YamlLimitError) -> str:
    mark = error.problem_mark
    if mark is None:
        return str(error.problem)
    return f"{error.problem} (line {mark.line + 1}, column {mark.column + 1})"


def dump_config(config: ExperimentConfig) -> str:
    """The fully resolved config as YAML (defaults included), e.g. for a run's folder."""
    stream = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.dump(config.model_dump(mode="json"), stream)
    return stream.getvalue()


def _split_key(key: str) -> list[str | int]:
    parts: list[str | int] = []
    for piece in key.split("."):
        match = _KEY_PART.match(piece)
        if not match:
            raise ConfigError.single(key, "is not a key path like a.b or a.b[1]", rule=_OVERRIDE)
        parts.append(match.group(1))
        parts += [int(index) for index in re.findall(r"\[(\d+)\]", match.group(2))]
    return parts


def apply_override(data: dict[str, Any], override: str) -> None:
    """Set ``key.path[i]=value`` in ``data`` in place, creating mappings on the way."""
    key, separator, raw_value = override.partition("=")
    if not separator or not key:
        raise ConfigError.single(
            override, "an override must look like key.path=value", rule=_OVERRIDE
        )
    parts = _split_key(key.strip())
    value = parse_yaml(raw_value, f"the value of {key}") if raw_value.strip() else ""
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        following = parts[depth + 1]
        where = tuple(parts[: depth + 1])
        if isinstance(part, int):
            if not isinstance(node, list) or part >= len(node):
                raise ConfigError.single(where, "no such list item to override", rule=_OVERRIDE)
            node = node[part]
            continue
        if not isinstance(node, dict):
            raise ConfigError.single(where, _INSIDE_A_VALUE, rule=_OVERRIDE)
        if node.get(part) is None:
            node[part] = [] if isinstance(following, int) else {}
        node = node[part]
    last = parts[-1]
    where = tuple(parts)
    if isinstance(last, int):
        if not isinstance(node, list) or last > len(node):
            raise ConfigError.single(where, "no such list item to override", rule=_OVERRIDE)
        if last == len(node):
            node.append(value)
        else:
            node[last] = value
    elif isinstance(node, dict):
        node[last] = value
    else:
        raise ConfigError.single(where, _INSIDE_A_VALUE, rule=_OVERRIDE)


def _consistency_problems(config: ExperimentConfig) -> list[ConfigIssue]:
    """Rules that tie several keys together."""
    problems = []
    chunk = config.actor.model.num_action_chunks
    for index, horizon in enumerate(config.rollout.action_horizons_pattern):
        if horizon % chunk:
            problems.append(
                ConfigIssue(
                    "rollout.horizon_multiple",
                    f"{horizon} must be a multiple of actor.model.num_action_chunks ({chunk})",
                    ("rollout", "action_horizons_pattern", index),
                )
            )
    algorithm = config.algorithm
    if algorithm.name in ("grpo", "rloo") and algorithm.group_size < 2:
        problems.append(
            ConfigIssue(
                "algorithm.group_size",
                f"{algorithm.name} compares rollouts within a group: use group_size >= 2",
                ("algorithm", "group_size"),
            )
        )
    if algorithm.loss_aggregation == "episodes" and algorithm.name not in ("grpo", "rloo"):
        problems.append(
            ConfigIssue(
                "algorithm.loss_aggregation",
                f"episodes weighs an episode's shared outcome advantage: grpo and rloo "
                f"have one, {algorithm.name} does not",
                ("algorithm", "loss_aggregation"),
            )
        )
    if algorithm.data_batch_size % algorithm.group_size:
        problems.append(
            ConfigIssue(
                "algorithm.whole_groups",
                f"{algorithm.data_batch_size} must be a multiple of algorithm.group_size "
                f"({algorithm.group_size}) so groups stay whole",
                ("algorithm", "data_batch_size"),
            )
        )
    if algorithm.reward_filter.enabled and algorithm.group_size < 2:
        problems.append(
            ConfigIssue(
                "algorithm.group_size",
                "the group filter needs algorithm.group_size >= 2",
                ("algorithm", "reward_filter", "enabled"),
            )
        )
    if algorithm.name == "rlpd" and config.actor.strategy == "fsdp":
        problems.append(
            ConfigIssue(
                "actor.strategy",
                "fsdp shards the model over actor ranks; RLPD's learner is one process: use ddp",
                ("actor", "strategy"),
            )
        )
    if not config.critic.train_backbone and config.actor.model.kind != "vla":
        problems.append(
            ConfigIssue(
                "critic.train_backbone",
                f"false needs a π0's value head; a {config.actor.model.kind} policy's critic "
                "has an encoder of its own",
                ("critic", "train_backbone"),
            )
        )
    if config.actor.model.kind == "vla" and algorithm.name == "rlpd":
        problems.append(
            ConfigIssue(
                "algorithm.name",
                "a vla has no Q-critic: train it with ppo (a value head on its backbone), "
                "grpo or rloo",
                ("algorithm", "name"),
            )
        )
    if (
        config.actor.model.kind == "vla"
        and algorithm.name == "ppo"
        and config.actor.strategy == "fsdp"
    ):
        problems.append(
            ConfigIssue(
                "actor.strategy",
                "a vla's value head shares the policy's backbone, which fsdp would shard "
                "apart from it: use ddp",
                ("actor", "strategy"),
            )
        )
    if algorithm.name == "bc" and not algorithm.bc.demos:
        problems.append(
            ConfigIssue(
                "algorithm.bc.demos",
                "bc imitates demonstrations: name a demo file",
                ("algorithm", "bc", "demos"),
            )
        )
    model = config.actor.model
    if model.action_bounds == "demos" and algorithm.name != "bc" and not model.init_from:
        problems.append(
            ConfigIssue(
                "actor.model.action_bounds",
                "demos: the bounds are fitted to bc's demos (algorithm.name: bc) or come "
                "from the checkpoint the run starts from (actor.model.init_from); give "
                "[low, high] otherwise",
                ("actor", "model", "action_bounds"),
            )
        )
    if algorithm.name == "bc" and config.actor.strategy == "fsdp":
        problems.append(
            ConfigIssue("actor.strategy", "bc trains with ddp, not fsdp", ("actor", "strategy"))
        )
    if algorithm.use_plan_reward and algorithm.plan_reward_coef == 0:
        problems.append(
            ConfigIssue(
                "algorithm.plan_reward",
                "use_plan_reward is on but plan_reward_coef is 0: set a coefficient",
                ("algorithm", "plan_reward_coef"),
            )
        )
    copies = config.env.num_parallel_envs * algorithm.group_size
    if config.env.num_workers > copies:
        problems.append(
            ConfigIssue(
                "env.num_workers",
                f"{config.env.num_workers} workers for {copies} env copies "
                "(num_parallel_envs x group_size): some would have nothing to run",
                ("env", "num_workers"),
            )
        )
    if config.env.task_ids is not None:
        if not config.env.task_ids:
            problems.append(
                ConfigIssue("env.task_ids", "lists no task; use null for all", ("env", "task_ids"))
            )
        seen: set[int] = set()
        for index, task_id in enumerate(config.env.task_ids):
            if task_id < 0 or task_id in seen:
                problems.append(
                    ConfigIssue(
                        "env.task_ids",
                        f"{task_id} is negative or listed twice",
                        ("env", "task_ids", index),
                    )
                )
            seen.add(task_id)
    if config.env.name == "libero" and config.env.suite not in LIBERO_SUITE_MAX_STEPS:
        problems.append(
            ConfigIssue(
                "env.suite",
                f"unknown LIBERO suite {config.env.suite!r}; use one of "
                + ", ".join(LIBERO_SUITE_MAX_STEPS),
                ("env", "suite"),
            )
        )
    return problems


def validate_config(data: Mapping[str, Any] | None) -> ExperimentConfig:
    """Validate plain data (e.g. parsed YAML or an API payload); raise ``ConfigError``."""
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError.single((), "the config must be a mapping of sections", rule=_TYPE)
    cluster_problems, cluster, plan = _cluster_problems(data.get("cluster"))
    try:
        config = ExperimentConfig.model_validate(dict(data))
    except ValidationError as error:
        raise ConfigError(
            [_schema_problem(issue) for issue in error.errors()] + cluster_problems
        ) from None
    config, arm_problems = with_inventory_arms(config, cluster)
    problems = (
        _consistency_problems(config) + cluster_problems + arm_problems
        + _env_worker_problems(config, plan)
        + _rollout_worker_problems(config, plan)
    )  # fmt: skip
    if problems:
        raise ConfigError(problems)
    return config


def _cluster_problems(section: Any) -> tuple[list[ConfigIssue], Cluster | None, Plan | None]:
    """The `cluster:` section checked by `trainer.cluster`: the inventory, then its
    component placement (when it has one) resolved against it; the cluster and plan."""
    if not isinstance(section, Mapping):
        return [], None, None  # absent is allowed; another type is reported by the schema
    try:
        cluster = cluster_from_dict(section, ("cluster",))
        if cluster.component_placement is not None:
            return [], cluster, resolve_placement(cluster)
    except ClusterConfigError as error:
        return list(error.issues), None, None  # the same type: rule and key path kept
    return [], cluster, None


def _env_worker_problems(config: ExperimentConfig, plan: Plan | None) -> list[ConfigIssue]:
    """Placed env workers must give every actor rank at least one worker, and every
    worker at least one of its rank's copies."""
    env = plan.components.get("env") if plan is not None else None
    stages = config.rollout.pipeline_stages
    if not env:
        if stages == 1:
            return []
        return [
            ConfigIssue(
                _STAGES,
                f"{stages} stages need placed env workers (cluster.component_placement.env), "
                f"at least {stages} per actor rank",
                _STAGES_PATH,
            )
        ]
    ranks = len(plan.components.get("actor", ())) or 1
    copies = config.env.num_parallel_envs * config.algorithm.group_size
    try:
        shards = assign_env_shards(env, ranks, copies)
    except ConfigError as error:
        return error.problems
    fewest = min(len(block) for block in shards)
    if fewest < stages:
        return [
            ConfigIssue(
                _STAGES,
                f"{stages} stages need at least {stages} env workers per actor rank; a rank "
                f"has {fewest}",
                _STAGES_PATH,
            )
        ]
    return []


def _rollout_worker_problems(config: ExperimentConfig, plan: Plan | None) -> list[ConfigIssue]:
    """Rollout workers make one actor rank's decisions each: as many as there are ranks
    (on-policy runs; RLPD acts in its env workers), and not with pipeline stages."""
    rollouts = plan.components.get("rollout") if plan is not None else None
    if not rollouts or config.algorithm.name == "rlpd":
        return []
    where = ("cluster", "component_placement", "rollout")
    ranks = len(plan.components.get("actor", ())) or 1
    if len(rollouts) != ranks:
        return [
            ConfigIssue(
                "placement.rollout_workers",
                f"{len(rollouts)} rollout process(es) for {ranks} actor rank(s): each rank "
                "has one rollout worker or none",
                where,
            )
        ]
    if config.rollout.pipeline_stages > 1:
        return [
            ConfigIssue(
                _STAGES,
                "pipeline stages decide in the rank's own process; remove the rollout "
                "processes or set 1",
                _STAGES_PATH,
            )
        ]
    return []


def _schema_problem(issue: Mapping[str, Any]) -> ConfigIssue:
    """A problem pydantic found, its rule named after pydantic's error type."""
    if issue["type"] == "extra_forbidden":
        near = closest_key(ExperimentConfig, issue["loc"])
        message = f"unknown key; did you mean `{near}`?" if near else "unknown key"
        return ConfigIssue("config.unknown_key", message, tuple(issue["loc"]))
    return ConfigIssue(f"config.{issue['type']}", str(issue["msg"]), tuple(issue["loc"]))


def load_config(path: str | Path | None, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """Read ``path`` (or start from defaults if None), apply overrides, validate."""
    data: Any = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as error:
            raise ConfigError.single(
                (), f"cannot read {path}: {error.strerror}", rule="config.unreadable"
            ) from None
        data = parse_yaml(text, str(path)) or {}
        if not isinstance(data, dict):
            raise ConfigError.single((), f"{path} must hold a mapping of sections", rule=_TYPE)
    for override in overrides:
        apply_override(data, override)
    return validate_config(data)
