"""What a training run tells the control plane, and when: the runner's moments turned
into link messages. The runner knows nothing about the link; the CLI wires the two."""

from __future__ import annotations

import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from trainer.config.schema import ExperimentConfig
from trainer.link.environment import Link, link_from_env
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

    def placed(self, processes: list[dict[str, Any]]) -> None:
        """Where the run's processes are (node, pid, devices, interpreter)."""
        self.link.event("placed", {"processes": processes})

    def episode_video(self, record: dict[str, Any]) -> None:
        """A recorded episode (trainer.videos): the pages list it from this event."""
        self.link.event("episode", record)

    def model(self, card: dict[str, Any]) -> None:
        """The policy's model card (trainer.models.card), once it is built."""
        self.link.event("model", card)

    def on_metrics(self, iteration: int, metrics: dict[str, float]) -> None:
        """The runner's per-iteration hook: one metrics batch, then the progress."""
        self.last_metrics = metrics
        self.link.metrics(iteration, metrics)
        self.link.progress(iteration, self.total)

    def on_episodes(self, first: int, rates: list[float]) -> None:
        """Finished episodes' intervention rates, each stored at its episode's number
        (1-based, across the run) as its own series: an episode is not an iteration."""
        for number, rate in enumerate(rates, start=first):
            self.link.metrics(number, {"episodes/intervention_rate": rate})

    def on_checkpoint(self, iteration: int, path: Path) -> None:
        self.link.event("checkpoint", {"iteration": iteration, "path": str(path)})

    def recovered(self, iteration: int, what: str) -> None:
        """A fault the run got over (e.g. a dead env worker restarted, its iteration
        redone)."""
        self.link.event("recovered", {"iteration": iteration, "what": what})

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


class EvalReporter:
    """What `python -m trainer eval` tells the control plane: `started` and `placed`
    once the checkpoint and its config are loaded, a `progress` before the first task and after
    each (step = tasks done), the table as an `evaluated` event, then `finished` with its
    averages as the summary (`eval/success_rate`, `eval/success_rate_h<H>`,
    `eval/success_rate_task_<T>`, `eval/episodes`)."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.total = 0

    def started(self, about: dict[str, Any], process: dict[str, Any]) -> None:
        """`process`: where the evaluation runs (a `placed` event's one process)."""
        self.link.event("started", {"mode": "eval", **about})
        self.link.event("placed", {"processes": [process]})

    def task_done(self, done: int, total: int) -> None:
        self.total = total
        self.link.progress(done, total)

    def evaluated(self, table: dict[str, Any]) -> None:
        """`table`: the eval-*.json object (trainer.link.protocol.EvalTableData)."""
        self.link.event("evaluated", table)
        self.link.event(
            "finished",
            {"iteration": table["iteration"], "total": self.total, "summary": eval_summary(table)},
        )


def eval_summary(table: dict[str, Any]) -> dict[str, float]:
    """An evaluation's figures as a run summary: the suite average, per horizon, per task
    and the episode count."""
    summary = {"eval/success_rate": table["average"]}
    summary |= {f"eval/success_rate_h{h}": rate for h, rate in table["horizon_average"].items()}
    summary |= {f"eval/success_rate_task_{t['task_id']}": t["rate"] for t in table["tasks"]}
    summary["eval/episodes"] = sum(task["episodes"] for task in table["tasks"])
    return finite_values(summary)


@contextmanager
def run_link(run_folder: Path | None) -> Iterator[Link]:
    """The link of the process's run (a no-op link when the control plane did not launch
    it), spooling in `run_folder`: whatever escapes the block is reported as `failed`
    before it goes on up, and the link is flushed and closed on the way out."""
    link = link_from_env(run_folder=run_folder)
    try:
        yield link
    except BaseException as error:
        report_failure(link, error)
        raise
    finally:
        link.close()


def report_failure(link: Link, error: BaseException) -> None:
    """A `failed` event with the error's text and the end of its traceback."""
    link.event("failed", failure_data(error))


def failure_data(error: BaseException) -> dict[str, Any]:
    text = "".join(traceback.format_exception(error))
    return {
        "error": f"{type(error).__name__}: {error}"[:MAX_ERROR_CHARS],
        "traceback": text[-MAX_ERROR_CHARS:],
    }
