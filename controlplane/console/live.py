"""Which robots are online: the latest state each run's trainer reported to the console,
kept for a few seconds in the cache (shared by the web processes with Redis)."""

from __future__ import annotations

import time
from typing import Any

from django.core.cache import cache

# A run whose trainer has not reported for this long has no robot online.
ONLINE_S = 3.0


def _key(run_id: int) -> str:
    return f"console.run.{run_id}"


def remember(run_id: int, console: dict[str, Any]) -> None:
    """Keep a `console` message's robots (without its frames) as the run's latest."""
    robots = console.get("robots", [])
    cache.set(_key(run_id), {"time": time.time(), "task": console.get("task", ""),
                             "robots": robots}, timeout=2 * ONLINE_S)  # fmt: skip


def online(run_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Of these runs, those with robots online: run id → {time, task, robots}."""
    found = cache.get_many([_key(run_id) for run_id in run_ids])
    fresh = time.time() - ONLINE_S
    return {
        run_id: found[_key(run_id)]
        for run_id in run_ids
        if _key(run_id) in found and found[_key(run_id)]["time"] >= fresh
    }
