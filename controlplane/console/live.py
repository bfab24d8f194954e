"""Which robots are online: the latest state each run's trainer reported to the console,
kept for a few seconds in the cache (shared by the web processes with Redis)."""

from __future__ import annotations

import time
from typing import Any

from django.core.cache import cache

from trainer.link.console_messages import LEARNER_SOURCE

# A run whose trainer has not reported for this long has no robot online.
ONLINE_S = 3.0


def _key(run_id: int) -> str:
    return f"console.run.{run_id}"


def remember(run_id: int, console: dict[str, Any], source: str = LEARNER_SOURCE) -> None:
    """Keep a `console` message's robots (without its frames) as the latest of the run's
    process `source` (its own link, or a placed worker's robot link). Each process's
    robots are kept apart and merged when read; a process not heard from for ONLINE_S
    drops out. (Two links writing at once may lose one write: it is made again within
    REMEMBER_EVERY_S, well inside ONLINE_S.)"""
    now = time.time()
    sources = {
        name: kept
        for name, kept in (cache.get(_key(run_id)) or {}).items()
        if kept["time"] >= now - ONLINE_S
    }
    sources[source] = {"time": now, "task": console.get("task", ""),
                       "robots": console.get("robots", [])}  # fmt: skip
    cache.set(_key(run_id), sources, timeout=2 * ONLINE_S)


def online(run_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Of these runs, those with robots online: run id → {time, task, robots}, the
    robots of every process heard from lately, in the run's numbering."""
    found = cache.get_many([_key(run_id) for run_id in run_ids])
    fresh = time.time() - ONLINE_S
    merged = {}
    for run_id in run_ids:
        sources = [kept for kept in (found.get(_key(run_id)) or {}).values()
                   if kept["time"] >= fresh]  # fmt: skip
        if sources:
            newest = max(sources, key=lambda kept: kept["time"])
            robots = sorted((r for kept in sources for r in kept["robots"]),
                            key=lambda robot: robot["robot"])  # fmt: skip
            merged[run_id] = {"time": newest["time"], "task": newest["task"], "robots": robots}
    return merged
