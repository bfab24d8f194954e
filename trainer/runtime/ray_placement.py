"""Turning a placement `Plan` into Ray actors pinned to their nodes.

Each process becomes one actor:
- pinned to its node: by the node label `armature.io/node-rank` (`label_selector`), or, when
  the live node ids are known, by a hard `NodeAffinitySchedulingStrategy`;
- with a `runtime_env` carrying the node's env vars, the accelerator-visibility variable the
  plan computed, Ray's own setting of that variable switched off
  (`RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1`), and the node's interpreter as
  `py_executable` (supported by Ray 2.60's runtime envs).

Actors request `num_gpus=0`: the plan, not Ray's GPU accounting, decides which devices a
process sees. Components may deliberately share accelerators (`actor,inference: 0-7`), which
whole-GPU requests would turn into actors pending forever. Instead `check_plan_against_nodes`
verifies up front that every node rank and device the plan uses exists, and
`create_placed_actors` waits a bounded time for every actor to start.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainer.cluster import ACCELERATOR, ClusterConfigError, Plan, ProcessPlacement
from trainer.cluster.discovery import NODE_RANK_LABEL, node_accelerators, ranked_ray_nodes
from trainer.cluster.ranks import describe_nodes

# Ray sets each accelerator-visibility variable itself unless told not to.
RAY_NOSET_VARS = {
    "CUDA_VISIBLE_DEVICES": "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES": "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",
    "ASCEND_RT_VISIBLE_DEVICES": "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",
}
DEFAULT_START_TIMEOUT_S = 60.0


class PlacementUnsatisfiable(RuntimeError):
    """The live Ray cluster cannot run the plan; `problems` says why, one line each."""

    def __init__(self, problems: Sequence[str]) -> None:
        self.problems = list(problems)
        super().__init__(
            "the Ray cluster cannot satisfy the placement plan:\n"
            + "\n".join(f"- {problem}" for problem in self.problems)
        )


@dataclass(frozen=True)
class PlacedActor:
    process: ProcessPlacement
    handle: Any  # ray.actor.ActorHandle


def runtime_env_for(process: ProcessPlacement) -> dict[str, Any]:
    """Ray runtime_env: node env vars, accelerator visibility, interpreter."""
    env_vars = dict(process.env_vars)
    for variable, noset in RAY_NOSET_VARS.items():
        if variable in env_vars:
            env_vars[noset] = "1"
    runtime_env: dict[str, Any] = {"env_vars": env_vars}
    if process.python_interpreter_path:
        runtime_env["py_executable"] = process.python_interpreter_path
    return runtime_env


def actor_options(
    process: ProcessPlacement,
    *,
    node_id: str | None = None,
    num_cpus: float = 0,
) -> dict[str, Any]:
    """Options for `ActorClass.options(**...)` placing `process` on its node.

    Without `node_id` the actor is pinned by the node-rank label (nodes started with
    `ray start --labels=armature.io/node-rank=N`); with it, by hard node affinity.
    `num_cpus=0` lets co-located processes share a node's CPUs without pending.
    """
    options: dict[str, Any] = {
        "num_cpus": num_cpus,
        "num_gpus": 0,
        "runtime_env": runtime_env_for(process),
    }
    if node_id is None:
        options["label_selector"] = {NODE_RANK_LABEL: str(process.node_rank)}
    else:
        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(node_id, soft=False)
    return options


def check_plan_against_nodes(plan: Plan, nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    """Problems that stop `plan` from running on the Ray nodes `nodes` (from `ray.nodes()`):
    unknown node ranks, missing or different accelerators. Empty when it fits."""
    try:
        live = ranked_ray_nodes(nodes)
    except ClusterConfigError as error:
        return [issue.message for issue in error.issues]
    problems: list[str] = []
    missing: dict[int, set[str]] = defaultdict(set)
    devices_needed: dict[int, int] = defaultdict(int)
    types_needed: dict[int, set[str]] = defaultdict(set)
    for process in plan.processes:
        if process.node_rank not in live:
            missing[process.node_rank].add(process.component)
            continue
        if process.resource_kind == ACCELERATOR and process.visible_accelerators:
            needed = max(process.visible_accelerators) + 1
            devices_needed[process.node_rank] = max(devices_needed[process.node_rank], needed)
            if process.hardware_type:
                types_needed[process.node_rank].add(process.hardware_type)
    if missing:
        live_text = describe_nodes(live)
        for rank in sorted(missing):
            problems.append(
                f"node rank {rank} (components {', '.join(sorted(missing[rank]))}) is not in "
                f"the Ray cluster, which has {live_text}; join one with `./armature join "
                f"HEAD --node-rank {rank}` (a plain `ray start`: --labels={NODE_RANK_LABEL}="
                f"{rank}) or change the placement"
            )
    for rank, needed in sorted(devices_needed.items()):
        accelerators = node_accelerators(live[rank])
        have = accelerators.count if accelerators else 0
        if have < needed:
            problems.append(
                f"node rank {rank} needs accelerators 0-{needed - 1} but Ray reports {have}"
            )
        elif accelerators and accelerators.type not in ("GPU", "NPU"):
            wrong = sorted(kind for kind in types_needed[rank] if kind != accelerators.type)
            if wrong:
                problems.append(
                    f"node rank {rank} has {accelerators.type} accelerators but the plan "
                    f"expects {', '.join(wrong)}"
                )
    return problems


def create_placed_actors(
    actor_class: Any | Mapping[str, Any],
    plan: Plan,
    *,
    components: Iterable[str] | None = None,
    constructor_args: Callable[[ProcessPlacement], Sequence[Any]] | None = None,
    num_cpus: float = 0,
    timeout_s: float = DEFAULT_START_TIMEOUT_S,
    nodes: Sequence[Mapping[str, Any]] | None = None,
) -> list[PlacedActor]:
    """Start one `actor_class` actor per process (of `components`, default all; a mapping
    gives each component its own class), all at once, and wait until every one runs.
    Raises `PlacementUnsatisfiable` at once when the plan does not
    fit the live nodes, or after `timeout_s` if some actors still have not started (those
    already created are killed, so nothing is left pending)."""
    live_nodes = list(ray.nodes() if nodes is None else nodes)
    problems = check_plan_against_nodes(plan, live_nodes)
    if problems:
        raise PlacementUnsatisfiable(problems)
    node_ids = {rank: str(node["NodeID"]) for rank, node in ranked_ray_nodes(live_nodes).items()}
    wanted = list(plan.components) if components is None else list(components)
    unknown = [name for name in wanted if name not in plan.components]
    if unknown:
        raise PlacementUnsatisfiable([f"the plan has no component {name!r}" for name in unknown])
    placed: list[PlacedActor] = []
    for name in wanted:
        for process in plan.components[name]:
            options = actor_options(process, node_id=node_ids[process.node_rank], num_cpus=num_cpus)
            args = constructor_args(process) if constructor_args else ()
            cls = actor_class[name] if isinstance(actor_class, Mapping) else actor_class
            handle = cls.options(**options).remote(*args)
            placed.append(PlacedActor(process, handle))
    _wait_until_started(placed, timeout_s, live_nodes, num_cpus)
    return placed


def _wait_until_started(
    placed: list[PlacedActor],
    timeout_s: float,
    nodes: Sequence[Mapping[str, Any]],
    num_cpus: float,
) -> None:
    pending = {actor.handle.__ray_ready__.remote(): actor for actor in placed}
    deadline = time.monotonic() + timeout_s
    failures: list[str] = []
    while pending and time.monotonic() < deadline:
        ready, _ = ray.wait(
            list(pending), num_returns=len(pending), timeout=max(0.0, deadline - time.monotonic())
        )
        for ref in ready:
            actor = pending.pop(ref)
            try:
                ray.get(ref)
            except Exception as error:  # noqa: BLE001 - any start failure is reported
                failures.append(f"{_describe(actor.process)} failed to start: {error}")
    if not pending and not failures:
        return
    for actor in placed:
        ray.kill(actor.handle)  # never leave actors pending or half-started
    problems = failures[:]
    if pending:
        waiting = sorted(
            pending.values(), key=lambda a: (a.process.component, a.process.process_rank)
        )
        shown = ", ".join(_describe(actor.process) for actor in waiting[:10])
        more = f" and {len(waiting) - 10} more" if len(waiting) > 10 else ""
        cpus = {
            rank: (node.get("Resources") or {}).get("CPU", 0)
            for rank, node in ranked_ray_nodes(nodes).items()
        }
        ranks = sorted({actor.process.node_rank for actor in waiting})
        capacity = ", ".join(f"node {rank}: {cpus.get(rank, 0):g} CPUs" for rank in ranks)
        problems.append(
            f"{len(waiting)} actor(s) did not start within {timeout_s:g} s: {shown}{more} "
            f"(each requests num_cpus={num_cpus:g}; {capacity}); all actors of this plan "
            "were stopped"
        )
    raise PlacementUnsatisfiable(problems)


def _describe(process: ProcessPlacement) -> str:
    return f"{process.component}[{process.process_rank}] on node {process.node_rank}"
