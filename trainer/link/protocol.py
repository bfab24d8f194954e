"""The link protocol, version 1: the messages a trainer sends and the replies it gets.

Documented in docs/link-protocol.md. Every message is one JSON object in one text frame.
The control plane validates the same rules on its side (controlplane/runs/telemetry.py),
because the control plane may not import this package; tests check the two agree.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

PROTOCOL_VERSION = 1
EVENT_KINDS = ("started", "iteration", "checkpoint", "stopped", "finished", "failed")
EventKind = Literal["started", "iteration", "checkpoint", "stopped", "finished", "failed"]

# Limits the server enforces; the builders below keep within them.
MAX_VALUES_PER_MESSAGE = 1000
MAX_KEY_LENGTH = 200
MAX_EVENT_DATA_CHARS = 64 * 1024
MAX_ERROR_CHARS = 8000


@dataclass(frozen=True)
class Event:
    seq: int
    kind: EventKind
    data: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "type": "event",
            "seq": self.seq,
            "kind": self.kind,
            "data": self.data,
        }


@dataclass(frozen=True)
class Metrics:
    seq: int
    step: int
    time: float
    values: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "type": "metrics",
            "seq": self.seq,
            "step": self.step,
            "time": self.time,
            "values": self.values,
        }


@dataclass(frozen=True)
class Progress:
    seq: int
    step: int
    total: int

    def to_json(self) -> dict[str, Any]:
        return {
            "v": PROTOCOL_VERSION,
            "type": "progress",
            "seq": self.seq,
            "step": self.step,
            "total": self.total,
        }


Message = Event | Metrics | Progress


@dataclass(frozen=True)
class Reply:
    """What the server answers: ``ack`` once a message is stored (or was already), or
    ``error`` for a message it will never accept (resending it is pointless)."""

    type: Literal["ack", "error"]
    seq: int | None
    error: str = ""


def parse_reply(data: Any) -> Reply | None:
    """A server reply, or None for anything this version does not know (ignored)."""
    if not isinstance(data, dict) or data.get("type") not in ("ack", "error"):
        return None
    seq = data.get("seq")
    if not (isinstance(seq, int) and not isinstance(seq, bool)):
        seq = None
    return Reply(type=data["type"], seq=seq, error=str(data.get("error", "")))


def finite_values(values: dict[str, float]) -> dict[str, float]:
    """The values the protocol can carry: finite numbers under valid keys.

    JSON has no NaN or infinity, so a diverged loss is left out here (the JSONL log on
    disk still has it) rather than getting the whole batch rejected."""
    return {
        key: float(value)
        for key, value in values.items()
        if isinstance(key, str)
        and 0 < len(key) <= MAX_KEY_LENGTH
        and isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
    }


def metric_chunks(values: dict[str, float]) -> list[dict[str, float]]:
    """`finite_values` in chunks of at most MAX_VALUES_PER_MESSAGE."""
    items = list(finite_values(values).items())
    return [
        dict(items[start : start + MAX_VALUES_PER_MESSAGE])
        for start in range(0, len(items), MAX_VALUES_PER_MESSAGE)
    ]


def json_safe(value: Any) -> Any:
    """Event data made valid for the protocol: non-finite floats become null, keys
    strings, tuples lists and anything else its text."""
    if isinstance(value, bool) or value is None or isinstance(value, int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): json_safe(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item) for item in value]
    return str(value)
