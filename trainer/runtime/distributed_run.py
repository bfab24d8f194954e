"""A run whose placement gives it several actor ranks, or env workers of their own: one
placed Ray actor per actor rank and per env worker, the ranks training together through
torch.distributed, driven from the run's own process.

The driver (the Ray job's entrypoint, or `python -m trainer run` on a laptop with Ray)
- resolves the placement of the config's `cluster:` section to a plan and creates one
  `ActorRank` per `actor` process and one `EnvWorker` per `env` process of it, all at
  once, where the plan says (node, devices, env vars, interpreter), within a deadline
  (trainer.runtime.ray_placement);
- hands each rank its block of env workers (trainer.runtime.env_workers), which step the
  rank's env copies in shards while the rank runs the policy; a plan without `env`
  processes steps each rank's copies in the rank's own process;
- lets rank 0 pick the rendezvous address, has every rank join the process group, then
  starts every rank's training loop (trainer.runner.OnPolicyRunner, the same loop a
  single process runs);
- relays rank 0's metrics and checkpoints to its callbacks (the run's link), passes a
  stop request on to every rank, and fails the run with the rank's own error when one
  fails; ranks left waiting on a dead peer are stopped, never left running.

A plan with `rollout` processes (one per actor rank) makes each rank's decisions in its
rollout worker (trainer.runtime.rollout_workers); without them the rank runs its policy
itself. With `rollout.pipeline_stages` the env workers step in groups while the policy
decides the next group's actions (trainer.runner.collection).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any

from trainer.cluster import Plan, cluster_from_dict, resolve_placement
from trainer.config.env_shards import ACTOR, ENV, ROLLOUT, EnvShard, assign_env_shards
from trainer.config.errors import ConfigError
from trainer.config.schema import ExperimentConfig
from trainer.devices import describe_device, visible_gpus
from trainer.models.card import model_card
from trainer.runner.build import compute_device, copies_per_rank, env_options
from trainer.runtime.ray_calls import answer, connect, has_failed
from trainer.runtime.shared_folder import check_shared_folder, reads_back
from trainer.whereabouts import ProcessReport

log = logging.getLogger(__name__)

JOIN_TIMEOUT_S = 120.0  # ranks meeting at the rendezvous
POLL_S = 0.2


class DistributedRunError(RuntimeError):
    """A rank failed, or the ranks could not be started or joined."""


def distributed_plan(config: ExperimentConfig) -> Plan | None:
    """The placement plan of a config whose `cluster:` section places processes; None
    when the run is this one process: no cluster section, or one actor rank that steps
    its own envs on node 0 (where the job's driver runs) as the plan would run it there,
    with no environment of its own."""
    section = config.cluster
    if not section:
        return None
    data = section.get("cluster", section)
    plan = resolve_placement(cluster_from_dict(data), data.get("component_placement"))
    components = plan.components
    actors = components.get(ACTOR, [])
    if not actors:
        raise ConfigError.single("cluster.component_placement", "places no actor process")
    if len(actors) == 1 and not components.get(ENV) and not components.get(ROLLOUT):
        (actor,) = actors
        if actor.node_rank == 0 and not actor.env_vars and not actor.python_interpreter_path:
            return None
    return plan  # env workers fit the ranks: the config's validation checked it


class ActorRank:
    """One actor rank, in its own placed process (a Ray actor, two threads: the loop,
    and the driver's stop request arriving while the loop runs)."""

    def __init__(
        self,
        config: dict[str, Any],
        output_dir: str,
        rank: int,
        world_size: int,
        node_rank: int,
        reports: Any,
        local_rank: int = 0,
    ) -> None:
        """`local_rank`: this rank's index among the actor ranks on its node, which
        `actor.device: auto` picks its GPU by when the process sees the node's GPUs."""
        os.environ["LOCAL_RANK"] = str(local_rank)
        self.config = ExperimentConfig.model_validate(config)
        self.output_dir = Path(output_dir)
        self.rank, self.world_size, self.node_rank = rank, world_size, node_rank
        self.reports = reports  # a ray.util.queue.Queue to the driver (rank 0 uses it)
        self.stop_asked = False
        self.runner = None
        self.collective = None
        self.robot_link = None

    def sees(self, path: str, token: str) -> bool:
        return reads_back(path, token)

    def rendezvous(self) -> tuple[str, int]:
        """An address on this node that the other ranks can reach, with a free port."""
        import ray

        address = ray.util.get_node_ip_address()
        with socket.socket() as sock:
            sock.bind((address, 0))
            return address, sock.getsockname()[1]

    def join(
        self,
        address: str,
        port: int,
        backend: str,
        timeout_s: float,
        env_workers: list[tuple[EnvShard, Any]],
        rollout_worker: Any = None,
        interventions: dict[str, Any] | None = None,
    ) -> list[ProcessReport]:
        """Join the process group and build the loop; this rank's process, its env
        workers' and its rollout worker's (when it has them), for the run page."""
        import ray

        from trainer.algorithms.collective import TorchCollective
        from trainer.runner.on_policy_runner import OnPolicyRunner
        from trainer.runtime.env_workers import PlacedVectorEnv
        from trainer.runtime.interfaces import pin_socket_interfaces

        node_ip = ray.util.get_node_ip_address()
        pin_socket_interfaces(node_ip)  # before the group forms: gloo reads it then
        device = compute_device(self.config)
        if backend == "nccl" and device.type != "cuda":
            raise ConfigError.single(
                "actor.device",
                f"actor rank {self.rank} has no GPU for NCCL: it sees {visible_gpus()}",
            )
        self.collective = TorchCollective(
            self.rank, self.world_size, address, port, backend, timeout_s, device
        )
        env, link, robots = None, None, None
        if env_workers:
            env = PlacedVectorEnv(env_workers, self.config.env.name, env_options(self.config),
                                  interventions=interventions)  # fmt: skip
        elif interventions is not None:
            link, robots = self._robot_link(interventions)
        self.runner = OnPolicyRunner(
            self.config,
            output_dir=self.output_dir,
            collective=self.collective,
            on_metrics=lambda it, metrics: self.reports.put(("metrics", it, metrics)),
            on_checkpoint=lambda it, path: self.reports.put(("checkpoint", it, str(path))),
            on_recovery=lambda it, what: self.reports.put(
                ("recovered", it, f"actor rank {self.rank}: {what}")
            ),
            env=env,
            link=link,
            robots=robots,
            on_episodes=lambda first, rates: self.reports.put(("episodes", first, rates)),
            on_video=lambda record: self.reports.put(("episode", 0, record)),
        )
        if self.rank == 0:
            card = model_card(self.runner.algorithm.policy, self.config.actor.model)
            self.reports.put(("model", 0, card))
        here = ProcessReport.here(
            ACTOR, self.rank, self.node_rank, node_ip, describe_device(device)
        )
        reports = [here, *(env.reports if env is not None else [])]
        if rollout_worker is not None:
            from trainer.runtime.rollout_workers import RemoteDecider

            runner_env = self.runner.env
            vision_language = runner_env.vision_language
            prepared = rollout_worker.prepare.remote(
                runner_env.obs_shape,
                runner_env.action_dim,
                vision_language.to_json() if vision_language else None,
            )
            report = ProcessReport(**ray.get(prepared, timeout=JOIN_TIMEOUT_S))
            self.runner.algorithm.decider = RemoteDecider(rollout_worker, report)
            reports.append(report)
        return reports

    def _robot_link(self, spec: dict[str, Any]) -> tuple[Any, Any]:
        """A rank that steps its own copies reaches the console over a robot link of
        its own (`actor-<rank>`), as an env worker does; its copies are the run's robots
        from rank x copies per rank on, its ended takeovers audited by the driver."""
        from trainer.link.environment import robot_link_from_env
        from trainer.runner.interventions import RobotSlice

        if self.config.env.interventions.source != "console":
            return None, None
        self.robot_link = robot_link_from_env(f"{ACTOR}-{self.rank}", spec["link_env"])

        def audit(kind: str, data: dict[str, Any]) -> None:
            self.reports.put(("event", 0, {"kind": kind, "data": data}))

        first = self.rank * copies_per_rank(self.config)
        return self.robot_link, RobotSlice(first, spec["total"], audit)

    def learn(self, resume: bool) -> dict[str, Any]:
        assert self.runner is not None, "join() first"
        history = self.runner.learn(resume=resume, should_stop=lambda: self.stop_asked)
        policy = self.runner.algorithm.acting_policy  # whole, sharded or not
        return {
            "iteration": self.runner.iteration,
            "last": history[-1] if history else {},
            "tasks": list(self.runner.task_cursor.tasks),
            # Ranks that stayed in sync hold bit-identical parameters.
            "parameters": [p.detach().double().sum().item() for p in policy.parameters()],
        }

    def ask_to_stop(self) -> None:
        self.stop_asked = True

    def close(self) -> None:
        if self.runner is not None:
            self.runner.close()  # its console first: it audits the takeovers it ends
        if self.robot_link is not None:
            self.robot_link.close()
        if self.collective is not None:
            self.collective.close()


@dataclass
class DistributedResult:
    iteration: int
    last_metrics: dict[str, float]
    ranks: list[ProcessReport] = field(default_factory=list)
    stopped: bool = False
    per_rank: list[dict[str, Any]] = field(default_factory=list)  # what each loop returned


def train_distributed(
    config: ExperimentConfig,
    plan: Plan,
    output_dir: Path,
    *,
    resume: bool = False,
    should_stop: Callable[[], bool] | None = None,
    on_metrics: Callable[[int, dict[str, float]], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    on_placed: Callable[[list[ProcessReport]], None] | None = None,
    on_recovery: Callable[[int, str], None] | None = None,
    on_model: Callable[[dict[str, Any]], None] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    link_env: dict[str, str] | None = None,
    on_episodes: Callable[[int, list[float]], None] | None = None,
    on_video: Callable[[dict[str, Any]], None] | None = None,
    start_timeout_s: float = 120.0,
) -> DistributedResult:
    """Train `config` on the actor ranks of `plan`; see the module's docstring.

    With interventions, each env worker wraps its copies for them: `link_env` (the
    run's link variables) lets a console reach the worker's robots over a robot link of
    its own; `on_event` gets the workers' stored events (ended takeovers). `on_video`
    gets rank 0's recorded episodes (`runner.videos`)."""
    import ray
    from ray.util.queue import Queue

    from trainer.runtime.env_workers import EnvWorker, env_worker_args, intervention_spec
    from trainer.runtime.ray_placement import create_placed_actors
    from trainer.runtime.rollout_workers import RolloutWorker

    connect()
    processes = plan.components[ACTOR]
    world_size = len(processes)
    # NCCL when every rank computes on a GPU its placement gives it, else gloo.
    on_gpus = config.actor.device != "cpu" and all(p.visible_accelerators for p in processes)
    backend = "nccl" if on_gpus else "gloo"
    local_ranks = _local_ranks(processes)
    shards = assign_env_shards(plan.components.get(ENV, []), world_size, copies_per_rank(config))
    shard_of = {shard.process.process_rank: shard for block in shards for shard in block}
    reports = Queue()
    settings = config.model_dump(mode="json")
    rank_args = lambda process: (  # noqa: E731
        settings, str(output_dir), process.process_rank, world_size, process.node_rank, reports,
        local_ranks[process.process_rank],
    )  # fmt: skip
    total = world_size * copies_per_rank(config)
    interventions = intervention_spec(config, total, link_env or {}, reports)
    env_args = env_worker_args(config.env.name, env_options(config), interventions)
    rollouts = plan.components.get(ROLLOUT, [])

    def constructor_args(process: Any) -> tuple:
        if process.component == ACTOR:
            return rank_args(process)
        if process.component == ROLLOUT:
            return (settings, process.process_rank, process.node_rank)
        return env_args(shard_of[process.process_rank])

    placed = create_placed_actors(
        {
            ACTOR: ray.remote(max_concurrency=2)(ActorRank),
            ENV: ray.remote(EnvWorker),
            ROLLOUT: ray.remote(RolloutWorker),
        },
        plan,
        components=[ACTOR, *([ENV] if shard_of else []), *([ROLLOUT] if rollouts else [])],
        constructor_args=constructor_args,
        timeout_s=start_timeout_s,
    )
    by_rank = sorted((a for a in placed if a.process.component == ACTOR), key=_rank)
    handles = [actor.handle for actor in by_rank]
    env_handles = {a.process.process_rank: a.handle for a in placed if a.process.component == ENV}
    # Rollout worker r makes actor rank r's decisions (the config's validation checked
    # there is one per rank).
    rollout_handles = {
        a.process.process_rank: a.handle for a in placed if a.process.component == ROLLOUT
    }
    try:
        check_shared_folder(
            output_dir, [(f"actor rank {a.process.process_rank} on node {a.process.node_rank}",
                          a.handle) for a in by_rank],
        )  # fmt: skip
        address, port = ray.get(handles[0].rendezvous.remote(), timeout=JOIN_TIMEOUT_S)
        joined = [
            handle.join.remote(
                address, port, backend, JOIN_TIMEOUT_S,
                [(s, env_handles[s.process.process_rank]) for s in shards[rank]],
                rollout_handles.get(rank), interventions,
            )
            for rank, handle in enumerate(handles)
        ]  # fmt: skip
        ranks = [
            report
            for reports_of_rank in answer(
                joined,
                who="an actor rank",
                doing="joining the process group",
                error=DistributedRunError,
                timeout_s=JOIN_TIMEOUT_S,
            )  # fmt: skip
            for report in reports_of_rank
        ]
        log.info("%d actor ranks joined at %s:%d (%s)", world_size, address, port, backend)
        if on_placed is not None:
            on_placed(ranks)
        handlers = {
            "metrics": on_metrics, "checkpoint": on_checkpoint, "recovered": on_recovery,
            "model": on_model, "event": on_event, "episodes": on_episodes, "episode": on_video,
        }  # fmt: skip
        loops = [h.learn.remote(resume) for h in handles]
        stop_sent = False
        while True:
            _relay(reports, handlers)
            if not stop_sent and should_stop is not None and should_stop():
                for handle in handles:
                    handle.ask_to_stop.remote()
                stop_sent = True
            done, _ = ray.wait(loops, num_returns=len(loops), timeout=POLL_S)
            failed = [ref for ref in done if has_failed(ref)]
            if failed:  # raises the rank's own error
                answer(failed, who="an actor rank", doing="training", error=DistributedRunError)
            if len(done) == len(loops):
                break
        results = ray.get(loops)
        _relay(reports, handlers)
        first = results[0]
        return DistributedResult(
            first["iteration"], first["last"], ranks, stopped=stop_sent, per_rank=results
        )
    finally:
        for handle in handles:
            try:
                ray.get(handle.close.remote(), timeout=10)
            except Exception:  # noqa: BLE001 - a dead or stuck rank is killed below
                pass
            ray.kill(handle)
        for handle in [*env_handles.values(), *rollout_handles.values()]:
            ray.kill(handle)  # the ranks closed them; any left (a rank that failed) go here
        _relay(reports, {"event": on_event})  # takeovers their closing ended
        reports.shutdown()


def _rank(actor: Any) -> int:
    return actor.process.process_rank


def _relay(reports: Any, handlers: dict[str, Callable[..., None] | None]) -> bool:
    """Pass the reports waiting on to their handlers (by kind; a kind without one is
    dropped); whether any came (a heartbeat, kind `alive`, included)."""
    heard = False
    while True:
        try:
            kind, iteration, payload = reports.get_nowait()
        except Empty:
            return heard
        heard = True
        handle = handlers.get(kind)
        if handle is None:
            continue
        if kind == "checkpoint":
            handle(iteration, Path(payload))
        elif kind in ("model", "episode"):
            handle(payload)
        elif kind == "event":
            handle(payload["kind"], payload["data"])
        else:  # metrics, recovered; episodes: the first episode's number, the rates
            handle(iteration, payload)


def _local_ranks(processes: list[Any]) -> dict[int, int]:
    """Each actor rank's index among the actor ranks of its node, in rank order."""
    seen: dict[int, int] = {}
    local: dict[int, int] = {}
    for process in sorted(processes, key=lambda p: p.process_rank):
        local[process.process_rank] = seen.get(process.node_rank, 0)
        seen[process.node_rank] = local[process.process_rank] + 1
    return local
