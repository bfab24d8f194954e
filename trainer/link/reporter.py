"""What a training run tells the control plane, and when: the runner's moments turned
into link messages. The runner knows nothing about the link; the CLI wires the two."""

from __future__ import annotations

import traceback
from pathlib import Path
from typing import Any

from trainer.config.schema import ExperimentConfig
from trainer.link.environment import Link
from trainer.link.protocol import MAX_ERROR_CHARS, finite_values


class RunReporter:
    def __init__(self, link: Link, config: ExperimentConfig) -> None:
        self.link = link
        self.total = config.runner.iterations
        self.config = config
        self.last_metrics: dict[str, float] = {}

    def started(self, resume: bool) -> None:
        self.link.event(
            "started",
            {
                "name": self.config.name,
                "algorithm": self.config.algorithm.name,
                "env": self.config.env.name,
                "iterations": self.total,
                "resume": resume,
            },
        )

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """The runner's per-iteration hook: one metrics batch, then the progress."""
        self.last_metrics = metrics
        self.link.metrics(iteration, metrics)
        self.link.progress(iteration, self.total)

    def on_checkpoint(self, iteration: int, path: Path) -> None:
        self.link.event("checkpoint", {"iteration": iteration, "path": str(path)})

    def stopped(self, iteration: int, signal_name: str) -> None:
        """Stopped early on request (a signal), with a checkpoint to resume from."""
        self.link.event(
            "stopped", {"iteration": iteration, "total": self.total, "signal": signal_name}
        )

    def finished(self, iteration: int) -> None:
        summary = finite_values(self.last_metrics)
        self.link.event(
            "finished", {"iteration": iteration, "total": self.total, "summary": summary}
        )


def report_failure(link: Link, error: BaseException) -> None:
    """A `failed` event with the error's text and the end of its traceback."""
    link.event("failed", failure_data(error))


def failure_data(error: BaseException) -> dict[str, Any]:
    text = "".join(traceback.format_exception(error))
    return {
        "error": f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS],
        "traceback": text[-MAX_ERROR_CHARS:],
    }
