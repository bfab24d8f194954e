"""Env workers as placed Ray actors: the `env` processes of a run's placement plan, each
owning a shard of one actor rank's env copies.

A rank's rollout sees its workers as one `VectorEnv` (`PlacedVectorEnv`, a
`ShardedVectorEnv`: an action batch is split by shard, every worker gets its shard at
once, the replies are joined in shard order); this module is the transport, replies
gathered within a deadline. The rollout loop, the plan cache and the
policy are the code a single process runs with its env in process; only the env is
elsewhere. Observations travel through Ray's object store.

With interventions configured (`env.interventions`), each worker wraps its copies for
them: the scripted operator, or the console, which reaches the worker's robots over a
robot link of the worker's own (trainer.link.environment.robot_link_from_env); its
safety rules run in the worker, on its clock. A step's intervention flags travel back
with the step.

A worker that dies, or does not answer within `reply_timeout_s`, raises `EnvWorkerError`
naming it (component rank, node, pid); `restart_workers` kills it and starts a fresh one
on the same placement, and the runner redoes the iteration (`runner.env_worker_retries`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import ray
import torch

from trainer.cluster.discovery import ranked_ray_nodes
from trainer.config.env_shards import ENV, EnvShard, shard_sizes
from trainer.config.schema import ExperimentConfig
from trainer.envs.pictures import picture_copies
from trainer.envs.registry import make_vector_env
from trainer.envs.sharded_vector_env import ShardedVectorEnv, env_facts
from trainer.envs.vector_env import EnvStep, EnvWorkerError, VectorEnv, concat_steps
from trainer.link.environment import Link, NullLink, robot_link_from_env
from trainer.runner.interventions import RobotSlice, close_env, with_interventions
from trainer.runtime.ray_calls import answer, has_failed
from trainer.runtime.ray_placement import actor_options
from trainer.whereabouts import ProcessReport

START_TIMEOUT_S = 300.0  # a worker importing torch and building its simulator
REPLY_TIMEOUT_S = 600.0


class EnvWorker:
    """One shard of env copies in its own placed process."""

    def __init__(
        self, env_name: str, num_envs: int, options: dict[str, Any], rank: int,
        interventions: dict[str, Any] | None = None,
    ) -> None:  # fmt: skip
        """`interventions` (`intervention_spec`, with this shard's `first` copy among
        the run's): the copies are wrapped for the configured source."""
        torch.set_num_threads(1)  # one core per worker: the placement decides how many
        self.env = make_vector_env(env_name, num_envs=num_envs, **options)
        self.rank = rank
        self.link: Link = NullLink()
        if interventions is not None:
            self.env = self._with_interventions(interventions)

    def _with_interventions(self, spec: dict[str, Any]) -> VectorEnv:
        document = spec["config"]
        # Each worker its own seed: the scripted operator differs per shard.
        seed = document["runner"]["seed"] + 1000 * (self.rank + 1)
        config = ExperimentConfig.model_validate(
            {**document, "runner": {**document["runner"], "seed": seed}}
        )
        if config.env.interventions.source == "console":
            self.link = robot_link_from_env(f"{ENV}-{self.rank}", spec["link_env"])
        reports = spec["reports"]

        def audit(kind: str, data: dict[str, Any]) -> None:  # to the run's link, by the driver
            reports.put(("event", 0, {"kind": kind, "data": data}))

        robots = RobotSlice(spec["first"], spec["total"], audit)
        return with_interventions(self.env, config, self.link, robots)

    def describe(self, node_rank: int) -> dict[str, Any]:
        return {
            **env_facts(self.env),
            "where": ProcessReport.here(  # envs step on the CPU
                ENV, self.rank, node_rank, ray.util.get_node_ip_address(), "cpu"
            ).to_json(),
        }

    def init_states(self, task_id: int) -> torch.Tensor:
        return self.env.init_states(task_id)

    def reset(self, task_id: int, init_states: torch.Tensor) -> torch.Tensor:
        return self.env.reset(task_id, init_states)

    def step(self, actions: torch.Tensor) -> EnvStep:
        return self.env.step(actions)

    def pictures(self, copies: list[int], size: int) -> np.ndarray | None:
        return picture_copies(self.env, copies, size)

    def close(self) -> None:
        close_env(self.env)  # a console first: it ends takeovers under way and audits them
        self.link.close()


def intervention_spec(
    config: ExperimentConfig, total: int, link_env: dict[str, str], reports: Any
) -> dict[str, Any] | None:
    """What env workers need to wrap their copies for the run's interventions (None
    without any): the config, the run's number of copies, the run's link variables (for
    robot links) and the driver's queue (for takeover audits)."""
    if config.env.interventions.source == "none":
        return None
    return {"config": config.model_dump(mode="json"), "total": total, "link_env": link_env,
            "reports": reports}  # fmt: skip


def env_worker_args(
    env_name: str, options: dict[str, Any], interventions: dict[str, Any] | None = None
):
    """Constructor arguments of a shard's worker, for `create_placed_actors`."""
    return lambda shard: (
        env_name, shard.num_envs, shard_options(options, shard), shard.process.process_rank,
        None if interventions is None else {**interventions, "first": shard.run_first_copy},
    )  # fmt: skip


def shard_options(options: dict[str, Any], shard: EnvShard) -> dict[str, Any]:
    """The env options of one shard: an env of one copy per listed robot (real arms)
    gets the robots of its own copies, so each arm is stepped by exactly one worker."""
    robots = options.get("robots")
    if not robots:
        return options
    return {**options, "robots": robots[shard.first_copy : shard.first_copy + shard.num_envs]}


class PlacedVectorEnv(ShardedVectorEnv):
    """A rank's env copies stepped by its placed env workers (see the module doc)."""

    def __init__(
        self,
        workers: Sequence[tuple[EnvShard, Any]],
        env_name: str,
        options: dict[str, Any],
        reply_timeout_s: float = REPLY_TIMEOUT_S,
        interventions: dict[str, Any] | None = None,
    ) -> None:
        """`interventions`: as the workers were made with (`intervention_spec`), for
        those restarted."""
        self._shards = [shard for shard, _ in workers]
        self._handles = [handle for _, handle in workers]
        self._make_args = env_worker_args(env_name, options, interventions)
        self.reply_timeout_s = reply_timeout_s
        self.shard_sizes = [shard.num_envs for shard in self._shards]
        self.num_envs = sum(self.shard_sizes)
        self.reports: list[ProcessReport | None] = [None] * len(workers)
        meta = self._call("describe", [(s.process.node_rank,) for s in self._shards], "starting")
        self.reports = [ProcessReport(**one["where"]) for one in meta]
        self._adopt(meta[0])

    def _describe(self, worker: int) -> str:
        process, report = self._shards[worker].process, self.reports[worker]
        pid = f", pid {report.pid}" if report is not None else ""
        return f"env worker {process.process_rank} (node {process.node_rank}{pid})"

    def _gather(self, calls: dict[int, Any], doing: str) -> list[Any]:
        """Each called worker's reply (by worker) within the deadline; the first failure
        names its worker. A worker that missed the deadline is killed, so that
        `restart_workers` replaces it."""
        refs = list(calls.values())
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self.reply_timeout_s)
        ready_set = set(ready)
        replies, errors = [], []
        for worker, ref in calls.items():
            if ref not in ready_set:
                ray.kill(self._handles[worker])
                errors.append(EnvWorkerError(
                    f"{self._describe(worker)} did not answer within "
                    f"{self.reply_timeout_s:g} s while {doing}; it was stopped"
                ))  # fmt: skip
                continue
            try:
                replies.append(
                    answer(ref, who=self._describe(worker), doing=doing, error=EnvWorkerError)
                )
            except EnvWorkerError as error:
                errors.append(error)
        if errors:
            raise errors[0]
        return replies

    def _call_some(self, method: str, args: dict[int, tuple], doing: str) -> list[Any]:
        calls = {
            worker: getattr(self._handles[worker], method).remote(*arguments)
            for worker, arguments in args.items()
        }
        return self._gather(calls, doing)

    def _call_first(self, method: str, args: tuple, doing: str) -> Any:
        return self._gather({0: getattr(self._handles[0], method).remote(*args)}, doing)[0]

    # ----- pipeline stages: the workers in `stages` contiguous groups, stepped apart ----
    def stage_workers(self, stages: int) -> list[range]:
        """The workers of each stage (contiguous, as even as possible)."""
        if not 1 <= stages <= len(self._handles):
            raise ValueError(
                f"{stages} pipeline stages need at least as many env workers; this rank "
                f"has {len(self._handles)}"
            )
        sizes = shard_sizes(len(self._handles), stages)
        starts = [sum(sizes[:stage]) for stage in range(stages)]
        return [range(start, start + size) for start, size in zip(starts, sizes, strict=True)]

    def stage_sizes(self, stages: int) -> list[int]:
        """Env copies per stage."""
        return [sum(self.shard_sizes[w] for w in workers) for workers in self.stage_workers(stages)]

    def step_async(self, actions: torch.Tensor, workers: range) -> dict[int, Any]:
        """Send one stage's actions (its copies' rows, in order) and return at once."""
        parts = torch.split(actions, [self.shard_sizes[w] for w in workers])
        sent = zip(workers, parts, strict=True)
        return {worker: self._handles[worker].step.remote(part) for worker, part in sent}

    def step_wait(self, calls: dict[int, Any]) -> EnvStep:
        """The stage's step, once every worker of it has answered (within the deadline)."""
        return concat_steps(self._gather(calls, "stepping"))

    def restart_workers(self) -> list[str]:
        """Replace every worker that is dead or stopped answering by a fresh one on the
        same placement; what was restarted, one line each."""
        probes = [handle.__ray_ready__.remote() for handle in self._handles]
        ready, _ = ray.wait(probes, num_returns=len(probes), timeout=5.0)
        node_ids = {rank: str(n["NodeID"]) for rank, n in ranked_ray_nodes(ray.nodes()).items()}
        remote = ray.remote(EnvWorker)
        restarted = []
        for worker, probe in enumerate(probes):
            if probe in ready and not has_failed(probe):
                continue
            before = self._describe(worker)
            ray.kill(self._handles[worker])
            shard = self._shards[worker]
            options = actor_options(shard.process, node_id=node_ids[shard.process.node_rank])
            self._handles[worker] = remote.options(**options).remote(*self._make_args(shard))
            ref = self._handles[worker].describe.remote(shard.process.node_rank)
            self.reports[worker] = ProcessReport(
                **self._gather({worker: ref}, "restarting")[0]["where"]
            )
            restarted.append(f"{before} restarted as pid {self.reports[worker].pid}")
        return restarted

    def close(self) -> None:
        refs = [handle.close.remote() for handle in self._handles]
        ray.wait(refs, num_returns=len(refs), timeout=10.0)
        for handle in self._handles:
            ray.kill(handle)
