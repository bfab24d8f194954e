"""RLPD's actors and learner as placed Ray processes (seed 004, HIL-SERL's split).

The plan's one `actor` process is the learner (`RLPDLearnerProcess`: the buffers, the
networks, checkpoints); each of its `env` processes is an acting worker
(`RLPDActorWorker`) that owns a shard of the env copies and a copy of the policy. Both
sides run at once:
- every iteration the learner hands each worker its copies' task and init states; the
  worker steps its copies through one episode with its latest weights and streams each
  step's transitions to the learner through a bounded Ray queue;
- the learner adds them to its buffers and makes the update rounds they pay for while
  the workers go on stepping, and publishes the actor's weights to every worker each
  `publish_every` updates (a worker takes them between two steps, never mid-forward).

Every exchange has a deadline (`exchange_timeout_s`), so a stalled side is reported,
never waited on forever:
- a worker that sends no transition within it while its episode runs, or does not take
  published weights, fails the run naming the worker (rank, node, pid);
- a learner that takes no transitions within it (its queue stays full) fails the
  worker's episode with that reason; a learner that stops reporting to the driver is
  named by the driver.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
import torch
from ray.util.queue import Full, Queue

from trainer.algorithms.rlpd import TanhGaussianActor
from trainer.algorithms.rlpd_algorithm import RLPDAlgorithm, random_actions
from trainer.cluster import Plan
from trainer.config.env_shards import ENV, ROLLOUT, shard_sizes
from trainer.config.errors import ConfigError
from trainer.config.schema import ExperimentConfig
from trainer.devices import describe_device
from trainer.link.environment import Link, NullLink, robot_link_from_env
from trainer.runner.interventions import RobotSlice, close_env
from trainer.runner.rlpd_episodes import EpisodeStats
from trainer.runtime.distributed_run import (
    ACTOR,
    DistributedResult,
    DistributedRunError,
    _relay,
)
from trainer.runtime.ray_calls import answer, connect
from trainer.runtime.shared_folder import check_shared_folder, reads_back
from trainer.whereabouts import ProcessReport

if TYPE_CHECKING:
    from collections.abc import Callable

    from trainer.runner.rlpd_runner import RLPDRunner

QUEUE_MESSAGES = 256  # steps in flight from all workers before they wait for the learner
HEARTBEAT_S = 1.0
POLL_S = 0.005


class ExchangeTimeout(RuntimeError):
    """One side of the actor-learner split did not answer within its deadline."""


def check_rlpd_plan(plan: Plan) -> None:
    """RLPD has one learner; its env copies are in it or in its `env` workers."""
    learners = plan.components.get(ACTOR, ())
    if len(learners) != 1:
        raise ConfigError.single(
            "cluster.component_placement.actor",
            f"rlpd has one learner: place exactly one actor process, not {len(learners)}",
        )
    if plan.components.get(ROLLOUT) or not plan.components.get(ENV):
        raise ConfigError.single(
            "cluster.component_placement",
            "rlpd acts in its env workers (each with a copy of the policy): place env "
            "processes and no rollout processes",
        )


class RLPDActorWorker:
    """An acting worker in its placed process (a threaded Ray actor: the episode runs in
    one thread while published weights arrive in the other)."""

    def __init__(
        self, config: dict[str, Any], rank: int, node_rank: int, num_envs: int,
        transitions: Queue, timeout_s: float, first_copy: int = 0,
        reports: Queue | None = None, link_env: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        """`reports`: the driver's queue, which this worker's ended takeovers reach the
        run's link by; `link_env`: the run's link variables, which this worker's own
        robot link to the control plane authenticates with (console runs)."""
        from trainer.runner.rlpd_runner import LocalEpisodes, build_env

        torch.set_num_threads(1)  # one core per worker: the placement decides how many
        total_robots = config["env"]["num_parallel_envs"]  # the run's, numbered across it
        config = {**config, "env": {**config["env"], "num_parallel_envs": num_envs}}
        real = config["env"].get("real_robot") or {}
        if real.get("robots"):  # real arms: this worker steps those of its own copies
            robots = real["robots"][first_copy : first_copy + num_envs]
            config["env"]["real_robot"] = {**real, "robots": robots}
        config["env"]["num_workers"] = min(config["env"].get("num_workers") or 0, num_envs)
        # Each worker its own seed: the scripted operator and exploration differ per shard.
        seed = config["runner"]["seed"] + 1000 * (rank + 1)
        config["runner"] = {**config["runner"], "seed": seed}
        self.config = ExperimentConfig.model_validate(config)
        self.rank, self.node_rank = rank, node_rank
        self.link: Link = NullLink()
        robots = None
        if self.config.env.interventions.source == "console":
            # Commands for this worker's robots come straight to it, and its safety rules
            # run here on its own clock: never through the learner.
            self.link = robot_link_from_env(f"{ENV}-{rank}", link_env or {})
            robots = RobotSlice(first_copy, total_robots, self._audit)
        self.reports = reports
        self.env = build_env(self.config, self.link, robots)
        # A failed env (a dead env worker, an arm's server gone) is restarted here and
        # its episodes run again, as in one process; each recovery reported.
        self.episodes = LocalEpisodes(
            self.env, self.config.runner.env_worker_retries, self._recovered
        )
        hidden = tuple(self.config.algorithm.rlpd.hidden_sizes)
        self.policy = TanhGaussianActor(self.env.obs_shape, self.env.action_dim, hidden)
        # Exploration and the policy's sampling draw from this generator, so a worker's
        # episodes follow from the run's seed, its rank and the weights it acts with.
        self.generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        self.transitions, self.timeout_s = transitions, timeout_s
        self.version = -1  # the learner's update count when the weights were published
        self._published: tuple[int, dict] | None = None
        self._lock = threading.Lock()
        self._arrived = threading.Condition(self._lock)

    def describe(self) -> dict[str, Any]:
        env = self.env
        return {
            "obs_shape": list(env.obs_shape),
            "action_dim": env.action_dim,
            "num_tasks": env.num_tasks,
            "init_state_counts": [int(env.init_states(t).shape[0]) for t in range(env.num_tasks)],
            "where": ProcessReport.here(  # an actor steps its copies and acts on the CPU
                ENV, self.rank, self.node_rank, ray.util.get_node_ip_address(), "cpu"
            ).to_json(),
        }

    def set_weights(self, version: int, state: dict[str, torch.Tensor]) -> None:
        with self._arrived:
            self._published = (version, state)
            self._arrived.notify_all()

    def _take_weights(self, at_least: int = -1) -> None:
        """The latest published weights, waiting (within the exchange deadline) for
        version `at_least` when this worker has older ones."""
        with self._arrived:
            arrived = self._arrived.wait_for(
                lambda: (
                    self.version >= at_least
                    or (self._published is not None and self._published[0] >= at_least)
                ),
                timeout=self.timeout_s,
            )
            published, self._published = self._published, None
        if not arrived:
            raise ExchangeTimeout(
                f"env worker {self.rank}: the learner's weights {at_least} did not arrive "
                f"within {self.timeout_s:g} s (stalled learner)"
            )
        if published is not None:
            self.version = published[0]
            self.policy.load_state_dict(published[1])

    def run_episode(
        self, task_id: int, indices: torch.Tensor, explore: bool, version: int
    ) -> tuple[EpisodeStats, int]:
        """One episode of every copy, starting with the weights of `version` (published
        before the episode was asked for) or newer ones: the first steps of an iteration
        act with what the learner had when it began, however the two calls interleave.
        Its stats and the weights' version acted with last."""
        if not explore:
            self._take_weights(at_least=version)

        def act(obs: torch.Tensor) -> torch.Tensor:
            self._take_weights()
            if explore:
                return random_actions(obs.shape[0], self.env.action_dim, self.generator)
            with torch.no_grad():
                return self.policy.act(obs, generator=self.generator)

        return self.episodes.episodes(task_id, indices, act, self._send), self.version

    def _send(self, rows: dict[str, torch.Tensor]) -> None:
        try:
            self.transitions.put((self.rank, rows), timeout=self.timeout_s)
        except Full:
            raise ExchangeTimeout(
                f"env worker {self.rank}: the learner took no transitions for "
                f"{self.timeout_s:g} s (stalled learner)"
            ) from None

    def _recovered(self, what: str) -> None:
        if self.reports is not None:
            self.reports.put(("recovered", 0, f"env worker {self.rank}: {what}"))

    def _audit(self, kind: str, data: dict[str, Any]) -> None:
        """A stored event of this worker's (an ended takeover), for the run's link."""
        if self.reports is not None:
            self.reports.put(("event", 0, {"kind": kind, "data": data}))

    def close(self) -> None:
        close_env(self.env)  # ends takeovers under way and audits them
        self.link.close()


@dataclass
class _Publication:
    ref: Any
    worker: int
    sent: float


class RLPDActors:
    """The learner's view of its acting workers: what their envs are, and one round of
    episodes on all of them while the learner trains on what they stream (the RLPD
    runner's collector for placed copies)."""

    steps_while_updating = True

    def __init__(
        self, workers: list[Any], reports: list[dict[str, Any]], sizes: list[int],
        transitions: Queue, settings: Any,
    ) -> None:  # fmt: skip
        self.workers, self.sizes, self.transitions = workers, sizes, transitions
        self.where = [ProcessReport(**report["where"]) for report in reports]
        first = reports[0]
        self.obs_shape = tuple(first["obs_shape"])
        self.action_dim, self.num_tasks = first["action_dim"], first["num_tasks"]
        self._init_state_counts = first["init_state_counts"]
        self.num_envs = sum(sizes)
        self.publish_every = settings.publish_every
        self.timeout_s = settings.exchange_timeout_s
        self.published_version = -1
        self.publications: list[_Publication] = []

    def init_state_count(self, task_id: int) -> int:
        return self._init_state_counts[task_id]

    def close(self) -> None:
        """Nothing: the driver that placed the workers stops them (train_rlpd_split)."""

    def describe(self, worker: int) -> str:
        where = self.where[worker]
        return f"env worker {worker} on node {where.node_rank} (pid {where.pid})"

    def collect(
        self, task_id: int, indices: torch.Tensor, algorithm: RLPDAlgorithm,
        capture: None = None,
    ) -> EpisodeStats:  # fmt: skip
        """Every worker runs one episode of `task_id` on its share of `indices` (acting
        at random while the algorithm explores); the transitions go into `algorithm`'s
        buffers and pay for its updates as they come."""
        explore = algorithm.exploring()
        self.publish(algorithm, force=True)
        pending, start = {}, 0
        for worker, (handle, size) in enumerate(zip(self.workers, self.sizes, strict=True)):
            part = indices[start : start + size]
            version = self.published_version
            pending[handle.run_episode.remote(task_id, part, explore, version)] = worker
            start += size
        heard = [time.monotonic()] * len(self.workers)
        results: dict[int, tuple[EpisodeStats, int]] = {}
        while pending:
            looked = self._take_transitions(algorithm, heard)
            self.publish(algorithm)
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=POLL_S)
            for ref in done:
                worker = pending.pop(ref)
                results[worker] = self._result(ref, worker)
            for worker in pending.values():
                if looked - heard[worker] > self.timeout_s:
                    raise ExchangeTimeout(
                        f"{self.describe(worker)} sent no transition for {self.timeout_s:g} s "
                        "(stalled actor)"
                    )
        self._take_transitions(algorithm, heard)  # a worker's last puts precede its reply
        ordered = [results[worker] for worker in range(len(self.workers))]
        acted_with = [version for _, version in ordered if version >= 0]
        lag = algorithm.learner.updates - sum(acted_with) / len(acted_with) if acted_with else None
        return EpisodeStats.concat([stats for stats, _ in ordered], lag)

    def _take_transitions(self, algorithm: RLPDAlgorithm, heard: list[float]) -> float:
        """Feeds what the workers have sent into `algorithm`; returns when the queue was
        looked at. A worker is heard from when its rows are seen in the queue, not when
        they are trained on: the updates they pay for can take longer than the deadline
        on a busy machine, and rows put meanwhile wait unseen, so a worker is only judged
        over the time the learner looked."""
        waiting = self.transitions.qsize()
        looked = time.monotonic()
        if waiting:
            batch = self.transitions.get_nowait_batch(waiting)
            for worker, _ in batch:
                heard[worker] = looked
            for _, rows in batch:
                algorithm.take_step(rows)
        return looked

    def _result(self, ref: Any, worker: int) -> tuple[EpisodeStats, int]:
        # A worker that found the learner stalled says so: its ExchangeTimeout passes.
        return answer(
            ref, who=self.describe(worker), doing="acting", error=DistributedRunError,
            passes=(ExchangeTimeout,),
        )  # fmt: skip

    def publish(self, algorithm: RLPDAlgorithm, force: bool = False) -> None:
        """The actor's weights to every worker when `publish_every` updates have passed
        since the last publication (or any have, when `force`); a worker that has not
        taken a publication within the deadline is reported."""
        now = time.monotonic()
        sent = [p for p in self.publications if not ray.wait([p.ref], timeout=0)[0]]
        for late in sent:
            if now - late.sent > self.timeout_s:
                raise ExchangeTimeout(
                    f"{self.describe(late.worker)} did not take the published weights "
                    f"within {self.timeout_s:g} s (stalled actor)"
                )
        self.publications = sent
        version = algorithm.learner.updates
        due = version - self.published_version
        if due <= 0 or (not force and due < self.publish_every):
            return
        weights = algorithm.learner.actor.state_dict()
        # On the CPU: the actors act there, whatever device the learner is on.
        state = ray.put({name: tensor.detach().cpu() for name, tensor in weights.items()})
        for worker, handle in enumerate(self.workers):
            ref = handle.set_weights.remote(version, state)
            self.publications.append(_Publication(ref, worker, now))
        self.published_version = version


class RLPDLearnerProcess:
    """The learner in its placed process: an RLPDRunner whose env copies are the workers'."""

    def __init__(
        self, config: dict[str, Any], output_dir: str, node_rank: int, reports: Queue
    ) -> None:
        self.config = ExperimentConfig.model_validate(config)
        self.output_dir, self.node_rank, self.reports = Path(output_dir), node_rank, reports
        self.stop_asked = False
        self.runner: RLPDRunner | None = None

    def sees(self, path: str, token: str) -> bool:
        return reads_back(path, token)

    def start(
        self, workers: list[Any], worker_reports: list[dict[str, Any]], sizes: list[int],
        transitions: Queue,
    ) -> dict[str, Any]:  # fmt: skip
        from trainer.runner.rlpd_runner import RLPDRunner

        actors = RLPDActors(workers, worker_reports, sizes, transitions, self.config.algorithm.rlpd)
        self.runner = RLPDRunner(
            self.config,
            output_dir=self.output_dir,
            on_metrics=lambda it, metrics: self.reports.put(("metrics", it, metrics)),
            on_checkpoint=lambda it, path: self.reports.put(("checkpoint", it, str(path))),
            actors=actors,
            on_episodes=lambda first, rates: self.reports.put(("episodes", first, rates)),
        )
        here = ProcessReport.here(
            ACTOR, 0, self.node_rank, ray.util.get_node_ip_address(),
            describe_device(self.runner.algorithm.device),
        )  # fmt: skip
        return here.to_json()

    def learn(self, resume: bool) -> dict[str, Any]:
        assert self.runner is not None, "start() first"
        beating = threading.Event()

        def heartbeat() -> None:  # tells the driver this process is alive between reports
            while not beating.wait(HEARTBEAT_S):
                self.reports.put(("alive", 0, None))

        threading.Thread(target=heartbeat, daemon=True).start()
        try:
            history = self.runner.learn(resume=resume, should_stop=lambda: self.stop_asked)
        finally:
            beating.set()
        return {"iteration": self.runner.iteration, "last": history[-1] if history else {}}

    def ask_to_stop(self) -> None:
        self.stop_asked = True


def train_rlpd_split(
    config: ExperimentConfig,
    plan: Plan,
    output_dir: Path,
    *,
    resume: bool = False,
    should_stop: Callable[[], bool] | None = None,
    on_metrics: Callable[[int, dict[str, float]], None] | None = None,
    on_checkpoint: Callable[[int, Path], None] | None = None,
    on_placed: Callable[[list[ProcessReport]], None] | None = None,
    on_event: Callable[[str, dict[str, Any]], None] | None = None,
    on_recovery: Callable[[int, str], None] | None = None,
    link_env: dict[str, str] | None = None,
    on_episodes: Callable[[int, list[float]], None] | None = None,
    start_timeout_s: float = 120.0,
) -> DistributedResult:
    """Train an RLPD `config` with its learner and acting workers where `plan` says.

    `on_event`: the workers' stored events (ended takeovers) for the run's link;
    `on_recovery`: a worker's env failure it got over (iteration, what);
    `link_env`: the run's link variables, for the workers' own robot links (console
    runs: operators reach each worker's robots directly)."""
    from trainer.runtime.ray_placement import create_placed_actors

    check_rlpd_plan(plan)
    connect()
    timeout_s = config.algorithm.rlpd.exchange_timeout_s
    relayed = {"iteration": 0}  # the last iteration relayed: a recovery is in the next

    def metrics(iteration: int, values: dict[str, float]) -> None:
        relayed["iteration"] = iteration
        if on_metrics is not None:
            on_metrics(iteration, values)

    def recovered(_: int, what: str) -> None:
        if on_recovery is not None:
            on_recovery(relayed["iteration"] + 1, what)

    env_processes = sorted(plan.components[ENV], key=lambda p: p.process_rank)
    sizes = shard_sizes(config.env.num_parallel_envs, len(env_processes))
    size_of = {p.process_rank: n for p, n in zip(env_processes, sizes, strict=True)}
    first_of = {p.process_rank: sum(sizes[:i]) for i, p in enumerate(env_processes)}
    reports, transitions = Queue(), Queue(maxsize=QUEUE_MESSAGES)
    settings = config.model_dump(mode="json")
    placed = create_placed_actors(
        {
            ACTOR: ray.remote(max_concurrency=2)(RLPDLearnerProcess),
            ENV: ray.remote(max_concurrency=2)(RLPDActorWorker),
        },
        plan,
        components=[ACTOR, ENV],
        constructor_args=lambda p: (
            (settings, str(output_dir), p.node_rank, reports)
            if p.component == ACTOR
            else (
                settings,
                p.process_rank,
                p.node_rank,
                size_of[p.process_rank],
                transitions,
                timeout_s,
                first_of[p.process_rank],
                reports,
                link_env,
            )
        ),  # fmt: skip
        timeout_s=start_timeout_s,
    )
    learner_process = next(a for a in placed if a.process.component == ACTOR)
    learner = learner_process.handle
    workers = [
        a.handle
        for a in sorted(placed, key=lambda a: a.process.process_rank)
        if a.process.component == ENV
    ]
    try:
        where = f"the learner on node {learner_process.process.node_rank}"
        check_shared_folder(output_dir, [(where, learner)])
        described = _answer([w.describe.remote() for w in workers], start_timeout_s, "starting")
        started = learner.start.remote(workers, described, sizes, transitions)
        here = _answer(started, start_timeout_s, "starting")
        processes = [ProcessReport(**here), *(ProcessReport(**d["where"]) for d in described)]
        if on_placed is not None:
            on_placed(processes)
        handlers = {
            "metrics": metrics, "checkpoint": on_checkpoint, "recovered": recovered,
            "event": on_event, "episodes": on_episodes,
        }  # fmt: skip
        loop = learner.learn.remote(resume)
        stop_sent, heard = False, time.monotonic()
        while True:
            if _relay(reports, handlers):
                heard = time.monotonic()
            if not stop_sent and should_stop is not None and should_stop():
                learner.ask_to_stop.remote()
                stop_sent = True
            done, _ = ray.wait([loop], timeout=0.2)
            if done:
                result = _answer(loop, 1.0, "learning")
                break
            if time.monotonic() - heard > timeout_s:
                raise ExchangeTimeout(
                    f"the learner on node {here['node_rank']} (pid {here['pid']}) sent "
                    f"nothing for {timeout_s:g} s (stalled learner)"
                )
        _relay(reports, handlers)
        return DistributedResult(
            result["iteration"], result["last"], processes, stop_sent, [result]
        )
    finally:
        for actor in placed:
            if actor.process.component == ENV:
                try:
                    ray.get(actor.handle.close.remote(), timeout=10)
                except Exception:  # noqa: BLE001 - a dead or stuck worker is killed below
                    pass
            ray.kill(actor.handle)
        # The takeovers the workers' closing ended, for the audit.
        _relay(reports, {"recovered": recovered, "event": on_event})
        for queue in (reports, transitions):
            queue.shutdown()


def _answer(refs: Any, timeout_s: float, doing: str) -> Any:
    """`ray.get` within the deadline; a stall another process detected keeps its type."""
    return answer(
        refs, who="a process of the run", doing=doing, error=DistributedRunError,
        timeout_s=timeout_s, stalled=ExchangeTimeout, passes=(ExchangeTimeout,),
    )  # fmt: skip
