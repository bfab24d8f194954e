"""Rank lists as users write them: `0-7`, `3`, `0-3,8,10-11`, or a YAML list of those."""

from __future__ import annotations

import re
from collections.abc import Iterable

# ASCII digits only: `\d` would also accept other scripts' digits, which int() converts.
_RANK_TOKEN = re.compile(r"\s*([0-9]+)\s*(?:-\s*([0-9]+)\s*)?", re.ASCII)


class RankSyntaxError(ValueError):
    """A rank list that cannot be read; the message says which token and why."""


def parse_rank_token(token: str) -> tuple[int, int]:
    """Parse `a-b` or `a` into an inclusive (first, last) pair."""
    match = _RANK_TOKEN.fullmatch(token)
    if match is None:
        raise RankSyntaxError(
            f"'{token.strip()}' is not a rank or a range: write a number like 3 or a range like 0-7"
        )
    first = int(match.group(1))
    last = int(match.group(2)) if match.group(2) is not None else first
    if last < first:
        raise RankSyntaxError(
            f"range '{token.strip()}' runs backwards: the first rank must not exceed the last"
        )
    return first, last


class RankOutOfRange(RankSyntaxError):
    """A rank at or beyond the number of nodes."""

    def __init__(self, first: int, last: int, limit: int) -> None:
        span = f"{first}-{last}" if first != last else str(first)
        super().__init__(
            f"rank {span} is out of range: the cluster has {limit} nodes (ranks 0-{limit - 1})"
            if limit > 0
            else f"rank {span} is out of range: the cluster has no nodes"
        )


def parse_rank_list(value: object, *, limit: int) -> list[int]:
    """Read node ranks given as an int, a `0-3,5` string or a list of those.

    `limit` is the exclusive upper bound (the number of nodes); it is checked before a range
    is expanded so that `0-999999999` fails fast instead of allocating.
    """
    pieces: list[object]
    if isinstance(value, list | tuple):
        pieces = list(value)
        if not pieces:
            raise RankSyntaxError("the list of ranks is empty")
    else:
        pieces = [value]
    ranks: list[int] = []
    for piece in pieces:
        if isinstance(piece, bool) or not isinstance(piece, int | str):
            raise RankSyntaxError(
                f"{piece!r} is not a rank: use numbers and ranges such as 0-7 or [0, 2, 5]"
            )
        if isinstance(piece, int):
            if piece < 0:
                raise RankSyntaxError(f"rank {piece} is negative")
            spans = [(piece, piece)]
        else:
            tokens = piece.split(",")
            if piece.strip() == "":
                raise RankSyntaxError("the rank list is empty")
            spans = []
            for token in tokens:
                if token.strip() == "":
                    raise RankSyntaxError(f"'{piece}' has an empty entry (a stray comma)")
                spans.append(parse_rank_token(token))
        for first, last in spans:
            if last >= limit:
                raise RankOutOfRange(first, last, limit)
            ranks.extend(range(first, last + 1))
    seen: set[int] = set()
    for rank in ranks:
        if rank in seen:
            raise RankSyntaxError(f"rank {rank} is listed more than once")
        seen.add(rank)
    return ranks


def format_ranks(ranks: Iterable[int]) -> str:
    """Compress ranks into the shortest range text: [0,1,2,3,5] -> '0-3,5'."""
    ordered = sorted(set(ranks))
    parts: list[str] = []
    index = 0
    while index < len(ordered):
        start = index
        while index + 1 < len(ordered) and ordered[index + 1] == ordered[index] + 1:
            index += 1
        first, last = ordered[start], ordered[index]
        parts.append(f"{first}-{last}" if last > first else str(first))
        index += 1
    return ",".join(parts)


def describe_nodes(ranks: Iterable[int]) -> str:
    """'node 3' or 'nodes 0-7,9' for messages."""
    text = format_ranks(ranks)
    return f"node {text}" if text.isdigit() else f"nodes {text}"
