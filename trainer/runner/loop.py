"""The one training loop every run goes through, whatever its algorithm and wherever its
experience comes from: iterations, stop requests, metrics (JSONL, TensorBoard, the
link's callback), the checkpoint cadence and resuming.

A runner is a `TrainingLoop` that says what one iteration is (`train_iteration`), what
its checkpoint holds (`state_dict` / `load_state`) and what else it keeps beside it
(`save_beside`). The loop is written for one rank of many: its `collective`
(trainer.algorithms.collective) agrees on stopping, and rank 0 writes the run's files.
Alone (the default), the collective is the identity.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainer.algorithms.collective import Collective
from trainer.config.addresses import redact_urls_in
from trainer.config.loading import dump_config
from trainer.config.schema import ExperimentConfig
from trainer.runner.checkpoints import (
    checkpoint_path,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from trainer.runner.metrics_log import JsonlMetricsLog
from trainer.runner.progress import ProgressBar
from trainer.runner.tensorboard_log import TensorBoardLog

MetricsCallback = Callable[[int, dict[str, float]], None]
RecoveryCallback = Callable[[int, str], None]
# The first finished episode's number (1-based, across the run) and each finished
# episode's share of decisions an operator took, in order.
EpisodesCallback = Callable[[int, list[float]], None]
CheckpointCallback = Callable[[int, Path], None]


class NothingToResumeError(RuntimeError):
    pass


class TrainingLoop(ABC):
    """Seeds the process, owns the run's folder and drives `train_iteration` to
    `runner.iterations`."""

    def __init__(
        self,
        config: ExperimentConfig,
        output_dir: Path | None = None,
        collective: Collective | None = None,
        on_metrics: MetricsCallback | None = None,
        on_checkpoint: CheckpointCallback | None = None,
        on_episodes: EpisodesCallback | None = None,
    ) -> None:
        self.config = config
        self.output_dir = Path(output_dir) if output_dir else run_folder(config)
        self.collective = collective or Collective()
        self.on_metrics, self.on_checkpoint = on_metrics, on_checkpoint
        self.on_episodes = on_episodes
        if config.runner.torch_threads:
            torch.set_num_threads(config.runner.torch_threads)
        # Seeding before the runner builds its models makes the initial weights part of
        # the seeded run; each rank draws its own stream.
        seed = config.runner.seed + self.collective.rank
        torch.manual_seed(seed)
        self.generator = torch.Generator().manual_seed(seed)
        self.iteration = 0
        self.total_env_steps = 0
        # With an operator: each finished episode's intervention rate, numbered across
        # the run (`episode_rates` is what the last iteration's episodes gave).
        self.episodes_done = 0
        self.episode_rates: list[float] = []
        self.metrics_log = JsonlMetricsLog(self.output_dir / "metrics.jsonl")
        self.checkpoint_dir = self.output_dir / "checkpoints"

    # ----- what a runner says ------------------------------------------------------
    @abstractmethod
    def train_iteration(self) -> dict[str, float]:
        """One iteration; its metrics."""

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """The checkpoint; every rank calls it (it may gather from all of them)."""

    @abstractmethod
    def load_state(self, state: dict[str, Any], path: Path) -> None:
        """Continue from `state`, the checkpoint read from `path`."""

    def save_beside(self, final: bool) -> None:  # noqa: B027 - an optional hook
        """What the runner keeps beside a checkpoint (rank 0; `final`: the run's last
        save, at its end or at a stop)."""

    def summary(self, metrics: dict[str, float]) -> str:
        """The progress bar's text for an iteration."""
        return f"success {metrics.get('rollout/success_rate', 0.0):.2f}"

    @abstractmethod
    def close(self) -> None:
        """Stop what the runner started (env workers, the console's bridge)."""

    # ----- the loop ----------------------------------------------------------------
    def learn(
        self, resume: bool = False, should_stop: Callable[[], bool] | None = None
    ) -> list[dict[str, float]]:
        """Run up to `runner.iterations`; returns each iteration's metrics.

        `should_stop` is asked after each iteration; when it says so (on any rank), the
        run saves a checkpoint to resume from and returns early."""
        if resume:
            self.restore()
        writes = self.collective.rank == 0  # one writer of the run's files
        tensorboard = None
        if writes:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            # The run's files are shown to every viewer: no password of a camera's URL.
            (self.output_dir / "config.yaml").write_text(redact_urls_in(dump_config(self.config)))
            self.metrics_log.truncate_after(self.iteration)
            tensorboard = TensorBoardLog.open(self.output_dir, resume_from=self.iteration)
        try:
            return self._iterate(should_stop, writes, tensorboard)
        finally:
            if tensorboard is not None:
                tensorboard.close()

    def _iterate(
        self,
        should_stop: Callable[[], bool] | None,
        writes: bool,
        tensorboard: TensorBoardLog | None,
    ) -> list[dict[str, float]]:
        total = self.config.runner.iterations
        shows_progress = writes and self.config.runner.progress
        progress = ProgressBar(total, start=self.iteration) if shows_progress else None
        history = []
        while self.iteration < total:
            self.episode_rates = []
            metrics = self.train_iteration()
            history.append(metrics)
            if writes:
                self.metrics_log.append(self.iteration, metrics)
                if tensorboard is not None:
                    tensorboard.append(self.iteration, metrics)
                if self.on_metrics is not None:
                    self.on_metrics(self.iteration, metrics)
                if self.on_episodes is not None and self.episode_rates:
                    self.on_episodes(self.episodes_done + 1, self.episode_rates)
            self.episodes_done += len(self.episode_rates)
            # One decision for every rank: a stop asked of any of them stops them all.
            stopping = self.collective.any(should_stop is not None and should_stop())
            final = stopping or self.iteration == total
            if final or self.iteration % self.config.runner.checkpoint_every == 0:
                path = self.save(final)
                if writes and self.on_checkpoint is not None:
                    self.on_checkpoint(self.iteration, path)
            if progress is not None:
                progress.update(self.iteration, self.summary(metrics))
            if stopping:
                break
        return history

    # ----- checkpoints -------------------------------------------------------------
    def save(self, final: bool = False) -> Path:
        """Every rank calls this; rank 0 writes the one checkpoint file, which must be on
        storage all ranks read (the run folder; shared when the cluster has several
        nodes) for them to resume."""
        state = {**self.state_dict(), "episodes_done": self.episodes_done}
        if self.collective.rank != 0:
            return checkpoint_path(self.checkpoint_dir, self.iteration)
        self.save_beside(final)
        return save_checkpoint(self.checkpoint_dir, self.iteration, state)

    def restore(self, path: Path | None = None) -> Path:
        path = path or latest_checkpoint(self.checkpoint_dir)
        if path is None:
            raise NothingToResumeError(f"no checkpoint to resume in {self.checkpoint_dir}")
        state = load_checkpoint(path)
        self.load_state(state, path)
        self.episodes_done = int(state.get("episodes_done", 0))
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
