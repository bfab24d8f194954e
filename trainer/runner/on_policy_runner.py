"""An on-policy iteration of one actor rank (PPO, GRPO, RLOO): pick this iteration's
task, collect exactly ``data_batch_size`` trajectories, compute advantages, update. The
loop around it (logging, checkpoints, resuming, stopping) is trainer.runner.loop's.

It is written for one rank of many: its ``collective`` (trainer.algorithms.collective)
says which rank it is, sums the rollout counts of all ranks before rates are computed,
averages gradients and agrees on stopping. Alone (the default), all of that is the
identity, so one process and a distributed run execute the same code. Rank 0 writes
the run's files (metrics, checkpoints holding every rank's cursors) and reports.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.algorithms.collective import Collective
from trainer.algorithms.metrics import (
    episode_counts,
    episode_intervention_rates,
    rates_from_counts,
    sum_counts,
)
from trainer.algorithms.on_policy import Decider
from trainer.config.env_shards import ACTOR, ROLLOUT
from trainer.config.schema import ExperimentConfig
from trainer.data.rollout_storage import Trajectories, empty_training_samples
from trainer.data.samplers import (
    InitStateSampler,
    TaskCursor,
    round_init_state_indices,
    shard_tasks,
)
from trainer.devices import (
    device_metrics,
    gpu_rng_state,
    load_gpu_rng_state,
    per_process_metrics,
)
from trainer.envs.vector_env import EnvWorkerError, VectorEnv
from trainer.link.environment import Link
from trainer.models.plan_cache import assign_horizons
from trainer.runner.build import build_components
from trainer.runner.checkpoints import shards_path
from trainer.runner.collection import CollectedBatch, collect_exact_batch, run_round
from trainer.runner.interventions import RobotSlice, close_env
from trainer.runner.loop import (
    CheckpointCallback,
    EpisodesCallback,
    MetricsCallback,
    NothingToResumeError,
    RecoveryCallback,
    TrainingLoop,
)
from trainer.videos.capture import RoundCapture
from trainer.videos.run_videos import RunVideos

log = logging.getLogger(__name__)


class OnPolicyRunner(TrainingLoop):
    def __init__(
        self,
        config: ExperimentConfig,
        output_dir: Path | None = None,
        collective: Collective | None = None,
        on_metrics: MetricsCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
        on_recovery: RecoveryCallback | None = None,
        env: VectorEnv | None = None,
        link: Link | None = None,
        on_episodes: EpisodesCallback | None = None,
        robots: RobotSlice | None = None,
        on_video: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """`env`: the rank's env when it is not built here (placed env workers).
        `link`: the link the operator console's commands arrive by (the run's, or a
        placed rank's robot link, whose copies are `robots` of the run's).
        `on_video`: told each recorded episode's record (`runner.videos`)."""
        super().__init__(config, output_dir, collective, on_metrics, on_checkpoint, on_episodes)
        rank = self.collective.rank
        self.on_recovery = on_recovery
        self.minibatch_generator = self.generator
        components = build_components(config, self.minibatch_generator, env, link, robots)
        self.env = components.env
        self.algorithm = components.algorithm
        self.algorithm.collective = self.collective
        for module in (self.algorithm.policy, self.algorithm.critic):
            if module is not None:  # every rank starts from rank 0's weights
                self.collective.broadcast_module(module)
        if config.actor.strategy == "fsdp":
            self.algorithm.shard()
        # Seed 001: tasks round-robin over ranks; a rank left without one (more ranks
        # than tasks) idles each iteration and still joins the gradient sync.
        shard = shard_tasks(components.task_ids, self.collective.world_size)[rank]
        self.task_cursor = TaskCursor(shard)
        self.init_states = InitStateSampler(
            {task: int(self.env.init_states(task).shape[0]) for task in components.task_ids}
        )
        chunk = config.actor.model.num_action_chunks
        self.steps_per_episode = -(-config.env.max_episode_steps // chunk)
        self.next_group_index = 0
        # Rank 0 records the episode videos (copies stepped by env workers are pictured
        # by their worker).
        self.videos: RunVideos | None = None
        if rank == 0:
            self.videos = RunVideos.of(config.runner.videos, self.env, self.output_dir, on_video)

    def _round_capture(
        self, task_id: int, indices: list[int], horizons: torch.Tensor
    ) -> RoundCapture | None:
        """What of the next round to record (rank 0's copies; with pipeline stages, the
        first stage's: `run_round` records that one)."""
        if self.videos is None:
            return None
        stages = self.config.rollout.pipeline_stages
        held = self.env.num_envs if stages == 1 else self.env.stage_sizes(stages)[0]
        iteration, group = self.iteration + 1, self.next_group_index

        def name(copy: int) -> str:
            return f"i{iteration:06d}-t{task_id}-g{group}-c{copy}"

        return self.videos.capture(
            iteration, task_id, self.env.task_name(task_id), [int(i) for i in indices],
            horizons.tolist(), held, name,
        )  # fmt: skip

    # ----- one iteration ---------------------------------------------------------
    def _next_round(self, task_id: int) -> Trajectories:
        algorithm_config = self.config.algorithm
        indices = round_init_state_indices(
            self.init_states,
            task_id,
            self.config.env.num_parallel_envs,
            algorithm_config.group_size,
            algorithm_config.init_states,
        )
        # One horizon per group, the groups taking the pattern's in turn over the run.
        horizons = assign_horizons(
            self.config.rollout.action_horizons_pattern,
            self.env.num_envs,
            algorithm_config.group_size,
            self.next_group_index,
        )
        capture = self._round_capture(task_id, indices, horizons)
        trajectories = run_round(
            self.env,
            self.algorithm,
            task_id,
            indices,
            horizons,
            self.steps_per_episode,
            self.next_group_index,
            algorithm_config.group_size,
            self.config.rollout.pipeline_stages,
            capture,
        )
        self.next_group_index += self.config.env.num_parallel_envs
        if capture is not None:
            self.videos.finish(capture)
        return trajectories

    def _collect_with_retries(self, task_id: int) -> CollectedBatch:
        """Collect the iteration's batch; when an env worker dies or hangs, restart it
        and redo the collection from the same init states (the cursors are put back),
        at most ``runner.env_worker_retries`` times, each reported."""
        algorithm_config = self.config.algorithm
        cursors, groups = self.init_states.state_dict(), self.next_group_index
        for attempt in range(self.config.runner.env_worker_retries + 1):
            try:
                return collect_exact_batch(
                    lambda: self._next_round(task_id),
                    data_batch_size=algorithm_config.data_batch_size,
                    round_size=self.env.num_envs,
                    group_size=algorithm_config.group_size,
                    filter_groups=algorithm_config.reward_filter.enabled,
                    max_attempts=algorithm_config.reward_filter.max_attempts,
                    scores=self.algorithm.trajectory_scores,
                )
            except EnvWorkerError as error:
                if attempt == self.config.runner.env_worker_retries:
                    raise EnvWorkerError(
                        f"{error} (iteration {self.iteration + 1}, given up after "
                        f"{attempt} restart(s))"
                    ) from error
                restarted = self.env.restart_workers()
                what = "; ".join(restarted) or "no worker needed a restart"
                log.warning("iteration %d: %s; %s; redoing it", self.iteration + 1, error, what)
                self.init_states.load_state_dict(cursors)
                self.next_group_index = groups
                if self.on_recovery is not None:
                    self.on_recovery(self.iteration + 1, f"{str(error).splitlines()[0]}; {what}")
        raise AssertionError("unreachable")

    def train_iteration(self) -> dict[str, float]:
        task_id = self.task_cursor.current()
        if self.videos is not None:
            self.videos.new_iteration()
        started = time.monotonic()
        if task_id is None:  # no task on this rank: nothing to collect
            collected = None
        else:
            collected = self._collect_with_retries(task_id)
        rollout_seconds = time.monotonic() - started
        episodes = collected.episodes if collected else []
        counts = sum_counts(episode_counts(e) for e in episodes)
        counts["env_steps"] = float(sum(int(e.episode_length.sum()) for e in episodes))
        counts["informative_groups"] = float(collected.informative_groups if collected else 0)
        counts["groups"] = float(collected.groups if collected else 0)
        counts = self.collective.sum_counts(counts)  # every rank's episodes
        started = time.monotonic()
        if collected is None:
            model = self.algorithm.policy
            rows = empty_training_samples(
                self.env.obs_shape, self.algorithm.chunk, model.action_dim, self.algorithm.device,
                getattr(self.algorithm.policy, "plan_latent_size", 0),
            )  # fmt: skip
        else:
            rows = self.algorithm.compute_returns(collected.batch).training_samples()
        metrics = self.algorithm.update_rows(rows)
        update_seconds = time.monotonic() - started
        samples = int(rows["weight"].shape[0])
        env_steps = int(counts.pop("env_steps"))
        informative = counts.pop("informative_groups", 0.0)
        groups = counts.pop("groups", 0.0)
        self.total_env_steps += env_steps
        self.iteration += 1
        self.task_cursor.advance()
        has_operator = self.config.env.interventions.source != "none"
        if has_operator:  # every rank's episodes, rank by rank
            mine = [rate for e in episodes for rate in episode_intervention_rates(e)]
            self.episode_rates = [
                r for rates in self.collective.gather_objects(mine) for r in rates
            ]
        metrics.update(rates_from_counts(counts, interventions=has_operator))
        if groups:
            # The groups whose outcomes differ, of all rolled out (the group filter keeps
            # only those): the share of the rollouts a group-relative update learns from.
            metrics["rollout/informative_group_share"] = informative / groups
        algorithm = self.algorithm
        metrics.update(gather_device_metrics(self.collective, algorithm.device, algorithm.decider))
        metrics.update(
            {
                "rollout/task_id": float(task_id if task_id is not None else -1),
                "rollout/rounds": float(collected.rounds if collected else 0),
                "rollout/masked_trajectories": float(
                    collected.masked_trajectories if collected else 0
                ),
                "charts/SPS": env_steps / max(rollout_seconds, 1e-9),
                "charts/samples_per_s": samples
                * self.config.algorithm.update_epochs
                / max(update_seconds, 1e-9),
                "charts/env_steps": float(self.total_env_steps),
                "charts/iteration_seconds": rollout_seconds + update_seconds,
                "charts/learning_rate": self.config.actor.learning_rate,
            }
        )
        return metrics

    def close(self) -> None:
        """Stop env workers, if the env has any, and the console, if it has one; finish
        the episode videos queued."""
        close_env(self.env)
        if self.videos is not None:
            self.videos.close()

    # ----- checkpoints -------------------------------------------------------------
    def rank_state(self) -> dict[str, Any]:
        """What differs between ranks: where each is in its tasks and init states, and
        its random generators."""
        return {
            "task_cursor": self.task_cursor.position,
            "init_states": self.init_states.state_dict(),
            "next_group_index": self.next_group_index,
            "torch_rng": torch.get_rng_state(),
            **gpu_rng_state(self.algorithm.device),
            "minibatch_rng": self.minibatch_generator.get_state(),
        }

    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "algorithm": self.algorithm.state_dict(
                shards_path(self.checkpoint_dir, self.iteration)
            ),
            "total_env_steps": self.total_env_steps,
            "config": self.config.model_dump(mode="json"),
            # Every rank's own state, in rank order (a collective: all ranks call it).
            "ranks": self.collective.gather_objects(self.rank_state()),
        }

    def load_state(self, state: dict[str, Any], path: Path) -> None:
        ranks = state.get("ranks") or [state]  # checkpoints of one rank before ranks
        if len(ranks) != self.collective.world_size:
            raise NothingToResumeError(
                f"{path} was written by {len(ranks)} actor rank(s), this run has "
                f"{self.collective.world_size}: resume with the same placement"
            )
        mine = ranks[self.collective.rank]
        self.iteration = state["iteration"]
        self.algorithm.load_state_dict(state["algorithm"])
        self.total_env_steps = state["total_env_steps"]
        self.task_cursor.position = mine["task_cursor"]
        self.init_states.load_state_dict(mine["init_states"])
        self.next_group_index = mine["next_group_index"]
        torch.set_rng_state(mine["torch_rng"])
        load_gpu_rng_state(mine, self.algorithm.device)
        self.minibatch_generator.set_state(mine["minibatch_rng"])

    def summary(self, metrics: dict[str, float]) -> str:
        return _summary(metrics)


def gather_device_metrics(
    collective: Collective,
    device: torch.device,
    decider: Decider | None,
    probe: Callable[[torch.device], dict[str, float]] = device_metrics,
) -> dict[str, float]:
    """This iteration's device memory and utilisation (`probe`): the process's own when
    it is the run's only computing one; else every actor rank's and rollout worker's,
    each under its process's name (rank 0 reports them; every rank calls this)."""
    mine = probe(device)
    if collective.world_size == 1 and decider is None:
        return mine
    processes = {f"{ACTOR}-{collective.rank}": mine}
    if decider is not None:
        processes[f"{ROLLOUT}-{collective.rank}"] = decider.device_metrics()
    gathered = collective.gather_objects(processes)
    return per_process_metrics({name: m for part in gathered for name, m in part.items()})


def _summary(metrics: dict[str, float]) -> str:
    parts = [f"success {metrics.get('rollout/success_rate', 0.0):.2f}"]
    parts += [
        f"h{key.rsplit('_h', 1)[1]} {value:.2f}"
        for key, value in sorted(metrics.items(), key=lambda item: _horizon(item[0]))
        if key.startswith("rollout/plan_success_rate_h")
    ]
    parts.append(f"SPS {metrics.get('charts/SPS', 0.0):.0f}")
    return " ".join(parts)


def _horizon(key: str) -> int:
    tail = key.rsplit("_h", 1)[-1]
    return int(tail) if tail.isdigit() else -1
