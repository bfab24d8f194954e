"""The link protocol, version 1: the messages a trainer sends and the replies it gets.

Documented in docs/link-protocol.md. Every message is one JSON object in one text frame.
These pydantic models are the one schema of the protocol: the trainer builds its
messages with them and the control plane validates what it receives with them
(`parse_message`), so the two ends cannot drift apart. Pure pydantic: importing this
module pulls in neither torch nor Ray.
"""

from __future__ import annotations

import json
import math
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)

PROTOCOL_VERSION = 1
EVENT_KINDS = (
    "started", "placed", "iteration", "checkpoint", "recovered", "evaluated", "stopped",
    "finished", "failed", "takeover",
)  # fmt: skip
EventKind = Literal[
    "started", "placed", "iteration", "checkpoint", "recovered", "evaluated", "stopped",
    "finished", "failed", "takeover",
]  # fmt: skip

MAX_VALUES_PER_MESSAGE = 1000
MAX_KEY_LENGTH = 200
MAX_EVENT_DATA_CHARS = 64 * 1024
MAX_MESSAGE_CHARS = 256 * 1024
MAX_ERROR_CHARS = 8000
MAX_SEQ = 2**63 - 1  # the database's bigint
MAX_PROGRESS = 2**31 - 1

MetricKey = Annotated[str, StringConstraints(min_length=1, max_length=MAX_KEY_LENGTH)]
MetricValues = dict[MetricKey, float]


class _Message(BaseModel):
    # strict: no "1" for 1, no true for 1; NaN and infinity are not numbers here.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    v: Literal[1] = PROTOCOL_VERSION
    seq: int = Field(ge=1, le=MAX_SEQ)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def payload(self) -> str:
        return self.model_dump_json()


class Event(_Message):
    type: Literal["event"] = "event"
    kind: EventKind
    data: dict[str, Any] = Field(default_factory=dict)

    @field_validator("data")
    @classmethod
    def _bounded_and_finite(cls, data: dict[str, Any]) -> dict[str, Any]:
        try:
            size = len(json.dumps(data, allow_nan=False))
        except (TypeError, ValueError) as error:
            raise ValueError(f"data must be plain JSON with finite numbers ({error})") from None
        if size > MAX_EVENT_DATA_CHARS:
            raise ValueError(f"data is {size} characters as JSON; at most {MAX_EVENT_DATA_CHARS}")
        return data

    @model_validator(mode="after")
    def _finished_has_a_summary(self) -> Event:
        if self.kind == "evaluated":
            _check(EvalTableData, self.data, "data")
        if self.kind == "takeover":
            _check(TakeoverData, self.data, "data")
        if self.kind != "finished":
            return self
        summary = self.data.get("summary")
        if not isinstance(summary, dict):
            raise ValueError("a finished event needs data.summary, an object of numbers")
        _check(_SUMMARY, summary, "data.summary")
        return self


def _check(schema: type[BaseModel] | TypeAdapter, data: Any, where: str) -> None:
    """Validate `data` against `schema`; a ValueError naming each field that is wrong."""
    try:
        if isinstance(schema, TypeAdapter):
            schema.validate_python(data)
        else:
            schema.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{where}.{'.'.join(map(str, issue['loc']))}: "
            + issue["msg"].removeprefix("Value error, ")
            for issue in error.errors(include_url=False)[:5]
        )
        raise ValueError(problems) from None


class Metrics(_Message):
    type: Literal["metrics"] = "metrics"
    step: int = Field(ge=0, le=MAX_SEQ)
    time: float = Field(ge=0)
    values: MetricValues = Field(min_length=1, max_length=MAX_VALUES_PER_MESSAGE)


class Progress(_Message):
    type: Literal["progress"] = "progress"
    step: int = Field(ge=0, le=MAX_PROGRESS)
    total: int = Field(ge=0, le=MAX_PROGRESS)

    @model_validator(mode="after")
    def _step_within_total(self) -> Progress:
        if self.step > self.total:
            raise ValueError("step must not exceed total")
        return self


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)


HorizonKey = Annotated[str, StringConstraints(pattern=r"^[1-9][0-9]{0,5}$")]
Rate = Annotated[float, Field(ge=0, le=1)]
Count = Annotated[int, Field(ge=0, le=MAX_PROGRESS)]


class EvalCell(_Strict):
    """Episodes of one task at one planning horizon."""

    successes: Count
    episodes: Count
    rate: Rate


class EvalTaskRow(_Strict):
    task_id: Count
    name: str = Field(max_length=300)
    episodes: Count
    successes: Count
    rate: Rate
    per_horizon: dict[HorizonKey, EvalCell] = Field(max_length=64)

    @model_validator(mode="after")
    def _successes_within_episodes(self) -> EvalTaskRow:
        if self.successes > self.episodes:
            raise ValueError("successes must not exceed episodes")
        return self


class EvalTableData(_Strict):
    """An `evaluated` event's data: the per-task table of `python -m trainer eval`, the
    same object as the eval-*.json file it writes (docs/training.md#evaluation)."""

    env: str = Field(min_length=1, max_length=100)
    suite: str | None = Field(max_length=100)
    checkpoint: str = Field(max_length=4096)
    iteration: Count
    horizons: list[Annotated[int, Field(ge=1, le=MAX_PROGRESS)]] = Field(max_length=64)
    average: Rate  # the suite average: the mean of the tasks' rates
    horizon_average: dict[HorizonKey, Rate] = Field(max_length=64)
    tasks: list[EvalTaskRow] = Field(min_length=1, max_length=1000)


class TakeoverData(_Strict):
    """A `takeover` event's data: one operator's control of one robot, for the audit."""

    operator: str = Field(min_length=1, max_length=150)
    robot: Count
    robot_name: str = Field(max_length=150)
    started: float  # time.time() on the trainer
    ended: float
    steps: Count
    reason: str = Field(max_length=200)


_SUMMARY = TypeAdapter(
    Annotated[MetricValues, Field(max_length=MAX_VALUES_PER_MESSAGE)],
    config=ConfigDict(strict=True, allow_inf_nan=False),
)

Message = Annotated[Event | Metrics | Progress, Field(discriminator="type")]
_MESSAGE = TypeAdapter(Message)


class InvalidMessage(ValueError):
    """A message the control plane will never accept; `seq` when it had a valid one."""

    def __init__(self, error: str, seq: int | None = None):
        super().__init__(error)
        self.error, self.seq = error, seq


def parse_message(text: str) -> Event | Metrics | Progress:
    """The message in one text frame, validated; raises InvalidMessage naming what is
    wrong (with the message's seq when it has a valid one)."""
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidMessage(f"message longer than {MAX_MESSAGE_CHARS} characters")
    try:
        # json.loads reads NaN, Infinity and 1e999 as floats: the models refuse them.
        data = json.loads(text)
    except ValueError as error:
        raise InvalidMessage(f"not JSON: {error}") from None
    if not isinstance(data, dict):
        raise InvalidMessage("a message must be a JSON object")
    seq = data.get("seq")
    seq = seq if type(seq) is int and 1 <= seq <= MAX_SEQ else None
    try:
        return _MESSAGE.validate_python(data)
    except ValidationError as error:
        raise InvalidMessage(_describe(error), seq) from None


def _describe(error: ValidationError) -> str:
    """Pydantic's errors as one line each: `values.loss: Input should be a finite number`."""
    lines = []
    for issue in error.errors(include_url=False)[:5]:
        # The first element of the location names the union member; the rest the field.
        where = ".".join(str(part)[:40] for part in issue["loc"][1:]) or "message"
        lines.append(f"{where}: {issue['msg'].removeprefix('Value error, ')}")
    return "; ".join(lines)


class Reply(BaseModel):
    """What the server answers: ``ack`` once a message is stored (or was already), or
    ``error`` for a message it will never accept (resending it is pointless)."""

    type: Literal["ack", "error"]
    seq: int | None = None
    error: str = ""

    def payload(self) -> str:
        return self.model_dump_json(exclude_defaults=False)


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
