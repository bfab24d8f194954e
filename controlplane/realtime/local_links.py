"""The trainer links open in this web process, by run: an operator's command for a run
whose link is here is handed to it directly, skipping the channel layer's round trip
(with Redis that hop is most of a command's latency; bench/teleop.py). Commands for a
link in another process still go through the run's trainer group."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

_links: defaultdict[int, set[Any]] = defaultdict(set)


def add(run_id: int, consumer: Any) -> None:
    _links[run_id].add(consumer)


def discard(run_id: int, consumer: Any) -> None:
    _links[run_id].discard(consumer)
    if not _links[run_id]:
        del _links[run_id]


def of_run(run_id: int) -> list[Any]:
    return list(_links.get(run_id, ()))
