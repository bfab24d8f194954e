"""A run's events, a page at a time (the API's cursor: the last event id seen)."""

from __future__ import annotations

from collections.abc import Mapping

from controlplane.runs.models import RunEvent
from controlplane.runs.query_params import parse_int

DEFAULT_PAGE, MAX_PAGE = 200, 1000


def events_page(run_id: int, params: Mapping[str, str]) -> dict:
    """The run's events after the event id `after`, oldest first, at most `limit`."""
    after = parse_int(params, "after", 0)
    limit = parse_int(params, "limit", DEFAULT_PAGE, low=1, high=MAX_PAGE)
    events = list(
        RunEvent.objects.filter(run_id=run_id, pk__gt=after)
        .order_by("pk")
        .values("id", "kind", "message", "data", "created_at")[: limit + 1]
    )
    more = len(events) > limit
    events = events[:limit]
    return {"results": events, "next_after": events[-1]["id"] if more else None}
