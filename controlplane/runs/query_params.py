"""Reading the query parameters of the metric and event reads; a bad one is a
`QueryError` whose message names it (the API answers 400 with it)."""

from __future__ import annotations

from collections.abc import Mapping


class QueryError(ValueError):
    """A request the API cannot answer; the message names what is wrong."""


def parse_int(params: Mapping[str, str], name: str, default=None, low=0, high=None):
    """An integer query parameter in [low, high]; a clear error otherwise."""
    text = params.get(name)
    if text in (None, ""):
        return default
    try:
        value = int(text)
    except ValueError:
        raise QueryError(f"{name}: {text!r} is not an integer.") from None
    if value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f"at least {low}"
        raise QueryError(f"{name}: must be {bound}, not {value}.")
    return value
