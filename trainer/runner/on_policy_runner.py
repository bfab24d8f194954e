"""The single-process training loop: pick this iteration's task, collect exactly
``data_batch_size`` trajectories, compute advantages, update, log, checkpoint.

It is written for one rank of many: ``rank``/``world_size`` choose the task shard and
``reduce_counts`` (an all-reduce sum in the distributed runtime) combines the rollout
counts of all ranks before rates are computed. Alone, both are trivial.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.algorithms.metrics import episode_counts, rates_from_counts, sum_counts
from trainer.config.loading import dump_config
from trainer.config.schema import ExperimentConfig
from trainer.data.rollout_storage import Trajectories
from trainer.data.samplers import (
    InitStateSampler,
    TaskCursor,
    round_init_state_indices,
    tasks_for_rank,
)
from trainer.models.plan_cache import assign_horizons
from trainer.runner.build import build_components
from trainer.runner.checkpoints import latest_checkpoint, load_checkpoint, save_checkpoint
from trainer.runner.collection import collect_exact_batch, run_round
from trainer.runner.metrics_log import JsonlMetricsLog
from trainer.runner.progress import ProgressBar

CountsReducer = Callable[[Counter[str]], Counter[str]]
MetricsCallback = Callable[[int, dict[str, float]], None]
CheckpointCallback = Callable[[int, Path], None]


class NothingToResumeError(RuntimeError):
    pass


class OnPolicyRunner:
    def __init__(
        self,
        config: ExperimentConfig,
        output_dir: Path | None = None,
        rank: int = 0,
        world_size: int = 1,
        reduce_counts: CountsReducer | None = None,
        on_metrics: MetricsCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
    ) -> None:
        self.config = config
        self.output_dir = Path(output_dir) if output_dir else run_folder(config)
        self.reduce_counts = reduce_counts or (lambda counts: counts)
        self.on_metrics = on_metrics
        self.on_checkpoint = on_checkpoint
        if config.runner.torch_threads:
            torch.set_num_threads(config.runner.torch_threads)
        # Seeding before building makes the initial weights part of the seeded run.
        torch.manual_seed(config.runner.seed + rank)
        self.minibatch_generator = torch.Generator().manual_seed(config.runner.seed + rank)
        components = build_components(config, self.minibatch_generator)
        self.env = components.env
        self.algorithm = components.algorithm
        self.task_cursor = TaskCursor(tasks_for_rank(components.task_ids, rank, world_size))
        self.init_states = InitStateSampler(
            {task: int(self.env.init_states(task).shape[0]) for task in components.task_ids}
        )
        self.horizons = assign_horizons(config.rollout.action_horizons_pattern, self.env.num_envs)
        chunk = config.actor.model.num_action_chunks
        self.steps_per_episode = -(-config.env.max_episode_steps // chunk)
        self.iteration = 0
        self.next_group_index = 0
        self.total_env_steps = 0
        self.metrics_log = JsonlMetricsLog(self.output_dir / "metrics.jsonl")
        self.checkpoint_dir = self.output_dir / "checkpoints"

    # ----- one iteration ---------------------------------------------------------
    def _next_round(self, task_id: int) -> Trajectories:
        algorithm_config = self.config.algorithm
        indices = round_init_state_indices(
            self.init_states,
            task_id,
            self.config.env.num_parallel_envs,
            algorithm_config.group_size,
        )
        trajectories = run_round(
            self.env,
            self.algorithm,
            task_id,
            indices,
            self.horizons,
            self.steps_per_episode,
            self.next_group_index,
            algorithm_config.group_size,
        )
        self.next_group_index += self.config.env.num_parallel_envs
        return trajectories

    def train_iteration(self) -> dict[str, float]:
        algorithm_config = self.config.algorithm
        task_id = self.task_cursor.current()
        started = time.monotonic()
        collected = collect_exact_batch(
            lambda: self._next_round(task_id),
            data_batch_size=algorithm_config.data_batch_size,
            round_size=self.env.num_envs,
            group_size=algorithm_config.group_size,
            filter_groups=algorithm_config.reward_filter.enabled,
            max_attempts=algorithm_config.reward_filter.max_attempts,
        )
        rollout_seconds = time.monotonic() - started
        counts = self.reduce_counts(sum_counts(episode_counts(e) for e in collected.episodes))
        env_steps = sum(int(e.episode_length.sum()) for e in collected.episodes)
        started = time.monotonic()
        batch = self.algorithm.compute_returns(collected.batch)
        metrics = self.algorithm.update(batch)
        update_seconds = time.monotonic() - started
        samples = int(batch.valid.sum())
        self.total_env_steps += env_steps
        self.iteration += 1
        self.task_cursor.advance()
        metrics.update(rates_from_counts(counts))
        metrics.update(
            {
                "rollout/task_id": float(task_id),
                "rollout/rounds": float(collected.rounds),
                "rollout/masked_trajectories": float(collected.masked_trajectories),
                "charts/SPS": env_steps / max(rollout_seconds, 1e-9),
                "charts/samples_per_s": samples
                * self.config.algorithm.update_epochs
                / max(update_seconds, 1e-9),
                "charts/env_steps": float(self.total_env_steps),
                "charts/learning_rate": self.config.actor.learning_rate,
            }
        )
        return metrics

    # ----- the loop ----------------------------------------------------------------
    def learn(
        self, resume: bool = False, should_stop: Callable[[], bool] | None = None
    ) -> list[dict[str, float]]:
        """Run up to ``runner.iterations``; returns each iteration's metrics.

        ``should_stop`` is asked after each iteration; when it says so, the runner saves
        a checkpoint (to resume from) and returns early."""
        if resume:
            self.restore()
        self.output_dir.mkdir(parents=True, exist_ok=True)
        (self.output_dir / "config.yaml").write_text(dump_config(self.config))
        self.metrics_log.truncate_after(self.iteration)
        total = self.config.runner.iterations
        progress = ProgressBar(total, start=self.iteration) if self.config.runner.progress else None
        history = []
        while self.iteration < total:
            metrics = self.train_iteration()
            history.append(metrics)
            self.metrics_log.append(self.iteration, metrics)
            if self.on_metrics is not None:
                self.on_metrics(self.iteration, metrics)
            stopping = should_stop is not None and should_stop()
            every = self.config.runner.checkpoint_every
            if stopping or self.iteration % every == 0 or self.iteration == total:
                path = self.save()
                if self.on_checkpoint is not None:
                    self.on_checkpoint(self.iteration, path)
            if progress is not None:
                progress.update(self.iteration, _summary(metrics))
            if stopping:
                break
        return history

    def close(self) -> None:
        """Stop env workers, if the env has any."""
        self.env.close()

    # ----- checkpoints -------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "iteration": self.iteration,
            "algorithm": self.algorithm.state_dict(),
            "task_cursor": self.task_cursor.position,
            "init_states": self.init_states.state_dict(),
            "next_group_index": self.next_group_index,
            "total_env_steps": self.total_env_steps,
            "torch_rng": torch.get_rng_state(),
            "minibatch_rng": self.minibatch_generator.get_state(),
            "config": self.config.model_dump(mode="json"),
        }

    def save(self) -> Path:
        return save_checkpoint(self.checkpoint_dir, self.iteration, self.state_dict())

    def restore(self, path: Path | None = None) -> Path:
        path = path or latest_checkpoint(self.checkpoint_dir)
        if path is None:
            raise NothingToResumeError(f"no checkpoint to resume in {self.checkpoint_dir}")
        state = load_checkpoint(path)
        self.iteration = state["iteration"]
        self.algorithm.load_state_dict(state["algorithm"])
        self.task_cursor.position = state["task_cursor"]
        self.init_states.load_state_dict(state["init_states"])
        self.next_group_index = state["next_group_index"]
        self.total_env_steps = state["total_env_steps"]
        torch.set_rng_state(state["torch_rng"])
        self.minibatch_generator.set_state(state["minibatch_rng"])
        return path


def run_folder(config: ExperimentConfig) -> Path:
    """Where a run writes: runner.output_dir, else var/runs/<name> (the name made one
    safe folder name, so it cannot lead outside var/runs/)."""
    if config.runner.output_dir:
        return Path(config.runner.output_dir)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", config.name).strip(".-")
    return Path("var", "runs", name or "experiment")


def has_checkpoint(config: ExperimentConfig) -> bool:
    return latest_checkpoint(run_folder(config) / "checkpoints") is not None


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
