"""Rollout metrics from counts that can be summed across ranks.

A rate averaged over ranks is wrong when ranks saw different numbers of episodes, so
every rate is derived from success/total counts, and counts are what ranks exchange.
Metric names are stable (the control plane charts them and CI gates on them):

- ``rollout/success_rate``, ``rollout/success_rate_task_{task_id}``,
  ``rollout/plan_success_rate_h{H}`` (e.g. ``rollout/plan_success_rate_h5``)
- ``rollout/episode_return``, ``rollout/episode_length`` (means, in env actions)
- the counts themselves, summable across iterations too (a chart of a rate over many
  iterations sums them, never averages rates): ``counts/episodes``,
  ``counts/successes``, and the same under ``counts/h{H}/``, ``counts/task{T}/`` and
  ``counts/task{T}/h{H}/`` (e.g. ``counts/task3/h5/successes``)
- with an operator (``env.interventions``): ``interventions/steps`` (decisions a human
  chose), ``interventions/episodes`` and ``interventions/rate`` (their share of the
  decisions), ``interventions/held_steps`` (decisions a safety rule held still: not a
  human's), ``rollout/unassisted_success_rate`` (success of the episodes the policy
  ran alone); and per finished episode (its number across the run as the step, not an
  iteration: trainer.link.reporter) ``episodes/intervention_rate``

Log-only numbers live in these dicts only; they never enter the training batch.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import replace

import torch

from trainer.data.rollout_storage import Trajectories


def episode_counts(trajectories: Trajectories) -> Counter[str]:
    """Summable counts for a set of finished episodes (read from the device in one go:
    the many small sums below then cost no round trip each)."""
    trajectories = _counted_fields_on_cpu(trajectories)
    counts: Counter[str] = Counter()
    success = trajectories.episode_success
    counts["episodes"] += float(success.numel())
    counts["successes"] += float(success.sum())
    counts["return_sum"] += float(trajectories.episode_return.sum())
    counts["length_sum"] += float(trajectories.episode_length.sum())
    intervened = trajectories.intervened & trajectories.valid
    counts["intervened_steps"] += float(intervened.sum())
    counts["intervened_episodes"] += float(intervened.any(0).sum())
    counts["held_steps"] += float((trajectories.held & trajectories.valid).sum())
    unassisted = ~trajectories.assisted
    counts["unassisted_episodes"] += float(unassisted.sum())
    counts["unassisted_successes"] += float(success[unassisted].sum())
    counts["decisions"] += float(trajectories.valid.sum())
    for key, labels in (("task", trajectories.task_id), ("plan_h", trajectories.horizon)):
        for label in labels.unique().tolist():
            chosen = labels == label
            counts[f"{key}{label}_success_count"] += float(success[chosen].sum())
            counts[f"{key}{label}_total_count"] += float(chosen.sum())
    cells = torch.stack([trajectories.task_id.long(), trajectories.horizon.long()], dim=1)
    for task, horizon in cells.unique(dim=0).tolist():
        chosen = (trajectories.task_id == task) & (trajectories.horizon == horizon)
        counts[f"task{task}/h{horizon}_success_count"] += float(success[chosen].sum())
        counts[f"task{task}/h{horizon}_total_count"] += float(chosen.sum())
    return counts


def episode_intervention_rates(trajectories: Trajectories) -> list[float]:
    """Each episode's (column's) share of decisions a human chose, in column order."""
    valid = trajectories.valid.cpu()
    intervened = (trajectories.intervened.cpu() & valid).sum(0)
    return (intervened / valid.sum(0).clamp(min=1)).tolist()


_COUNTED_FIELDS = (
    "episode_success", "episode_return", "episode_length", "intervened", "held", "valid",
    "task_id", "horizon",
)  # fmt: skip


def _counted_fields_on_cpu(trajectories: Trajectories) -> Trajectories:
    if trajectories.valid.device.type == "cpu":
        return trajectories
    return replace(
        trajectories, **{name: getattr(trajectories, name).cpu() for name in _COUNTED_FIELDS}
    )


def sum_counts(parts: Iterable[Counter[str]]) -> Counter[str]:
    """What an all-reduce (sum) of every rank's counts gives."""
    total: Counter[str] = Counter()
    for part in parts:
        total.update(part)
    return total


def rates_from_counts(counts: Counter[str], interventions: bool = False) -> dict[str, float]:
    """The rates and counts to log; with `interventions` (a run with an operator) the
    intervention metrics every iteration, zeros included, so their charts have a point
    for each (without it, only where some step was a human's or held)."""
    episodes = counts["episodes"]
    if not episodes:
        return {}
    metrics = {
        "rollout/success_rate": counts["successes"] / episodes,
        "rollout/episode_return": counts["return_sum"] / episodes,
        "rollout/episode_length": counts["length_sum"] / episodes,
        "rollout/episodes": episodes,
    }
    if interventions or counts["intervened_steps"] or counts["held_steps"]:
        metrics["interventions/episodes"] = counts["intervened_episodes"]
        metrics["interventions/steps"] = counts["intervened_steps"]
        metrics["interventions/held_steps"] = counts["held_steps"]
        metrics["interventions/rate"] = counts["intervened_steps"] / max(counts["decisions"], 1)
        if counts["unassisted_episodes"]:  # what the policy achieved on its own
            metrics["rollout/unassisted_success_rate"] = (
                counts["unassisted_successes"] / counts["unassisted_episodes"]
            )
    metrics.update(count_metrics(counts))
    for key, total in sorted(counts.items()):
        if not key.endswith("_total_count") or not total or "/" in key:
            continue
        label = key[: -len("_total_count")]
        rate = counts[f"{label}_success_count"] / total
        if label.startswith("plan_h"):
            metrics[f"rollout/plan_success_rate_h{label[len('plan_h') :]}"] = rate
        else:
            metrics[f"rollout/success_rate_task_{label[len('task') :]}"] = rate
    return metrics


def count_metrics(counts: Counter[str]) -> dict[str, float]:
    """The counts as ``counts/…`` metrics (names in the module docstring)."""
    metrics = {"counts/episodes": counts["episodes"], "counts/successes": counts["successes"]}
    for key, total in sorted(counts.items()):
        if not key.endswith("_total_count"):
            continue
        label = key[: -len("_total_count")]
        # plan_h{H} → counts/h{H}; task{T} and task{T}/h{H} keep their label.
        prefix = (
            f"counts/h{label[len('plan_h') :]}"
            if label.startswith("plan_h")
            else (f"counts/{label}")
        )
        metrics[f"{prefix}/episodes"] = total
        metrics[f"{prefix}/successes"] = counts[f"{label}_success_count"]
    return metrics
