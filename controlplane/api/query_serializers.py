"""The query parameters of the metric and event reads, as DRF serializers: each is read
and bounded here (drf-spectacular documents them from these fields), and a wrong one is
a 400 whose `detail` names it."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request

from controlplane.runs.run_events import DEFAULT_PAGE, MAX_PAGE
from controlplane.runs.series import (
    DEFAULT_BUCKETS,
    DEFAULT_POINTS_PAGE,
    MAX_BUCKETS,
    MAX_POINTS_PAGE,
    X_AXES,
    QueryError,
    StepRange,
    parse_keys,
)


def _bounded(
    default: int | None, low: int, high: int | None, what: str
) -> serializers.IntegerField:
    bound = f"between {low} and {high}" if high is not None else f"at least {low}"
    return serializers.IntegerField(
        required=False, default=default, min_value=low, max_value=high,
        help_text=f"{what}; {bound} (default {default})" if default is not None else what,
        error_messages={"min_value": f"must be {bound}.", "max_value": f"must be {bound}."},
    )  # fmt: skip


class BucketsQuery(serializers.Serializer):
    buckets = _bounded(DEFAULT_BUCKETS, 1, MAX_BUCKETS, "buckets per key at most")


class SeriesQuery(BucketsQuery):
    keys = serializers.CharField(help_text="k1,k2,prefix/* (a trailing * matches a prefix)")
    x = serializers.ChoiceField(
        choices=X_AXES, default="step", required=False,
        error_messages={"invalid_choice": f"'{{input}}' is not one of {', '.join(X_AXES)}."},
    )  # fmt: skip
    start = _bounded(None, 0, None, "first step (inclusive)")
    end = _bounded(None, 0, None, "last step (inclusive)")

    def validate_keys(self, text: str) -> list[str]:
        try:
            return parse_keys(text)
        except QueryError as error:
            raise serializers.ValidationError(str(error).partition(": ")[2]) from None

    def validate(self, data: dict[str, Any]) -> dict[str, Any]:
        start, end = data.get("start"), data.get("end")
        if start is not None and end is not None and start > end:
            raise serializers.ValidationError({"start": f"{start} is after end ({end})."})
        data["steps"] = StepRange(start, end)
        return data


class PointsQuery(serializers.Serializer):
    key = serializers.CharField(
        required=False, help_text="one key's points; without it, each key's latest"
    )
    after = _bounded(-1, -1, None, "points after this step (the cursor)")
    limit = _bounded(DEFAULT_POINTS_PAGE, 1, MAX_POINTS_PAGE, "points at most")


class EventsQuery(serializers.Serializer):
    after = _bounded(0, 0, None, "events after this id (the cursor)")
    limit = _bounded(DEFAULT_PAGE, 1, MAX_PAGE, "events at most")


def read_query(query: type[serializers.Serializer], request: Request) -> dict[str, Any]:
    """The request's query parameters as `query` reads them; a 400 naming each wrong one."""
    reading = query(data=request.query_params)
    if not reading.is_valid():
        detail = "; ".join(
            f"{name}: {' '.join(str(message) for message in messages)}"
            for name, messages in reading.errors.items()
        )
        raise ValidationError({"detail": detail})
    return reading.validated_data
