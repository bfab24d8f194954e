"""A run's events, a page at a time (the API's cursor: the last event id seen)."""

from __future__ import annotations

from controlplane.runs.models import RunEvent

DEFAULT_PAGE, MAX_PAGE = 200, 1000


def events_page(run_id: int, after: int = 0, limit: int = DEFAULT_PAGE) -> dict:
    """The run's events after the event id `after`, oldest first, at most `limit`."""
    events = list(
        RunEvent.objects.filter(run_id=run_id, pk__gt=after)
        .order_by("pk")
        .values("id", "kind", "message", "data", "created_at")[: limit + 1]
    )
    more = len(events) > limit
    events = events[:limit]
    return {"results": events, "next_after": events[-1]["id"] if more else None}
