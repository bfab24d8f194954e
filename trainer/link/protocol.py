"""The link protocol, version 1: the messages a trainer sends and the replies it gets.

Documented in docs/link-protocol.md. Every message is one JSON object in one text frame.
These pydantic models are the one schema of the protocol: the trainer builds its
messages with them and the control plane validates what it receives with them
(`parse_message`), so the two ends cannot drift apart. Pure pydantic (and the project's
rule for storable text, `trainer.bounded_yaml.UNSTORABLE`): importing this module pulls in
neither torch nor Ray.

Every limit a message is held to is a named constant here; docs/link-protocol.md states
them, and the control plane reads them from here.
"""

from __future__ import annotations

import json
import logging
import math
import re
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

from trainer.bounded_yaml import UNSTORABLE, unstorable_message

log = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
EVENT_KINDS = (
    "started", "placed", "model", "iteration", "checkpoint", "recovered", "evaluated",
    "stopped", "finished", "failed", "takeover", "estop", "episode",
)  # fmt: skip
EventKind = Literal[
    "started", "placed", "model", "iteration", "checkpoint", "recovered", "evaluated",
    "stopped", "finished", "failed", "takeover", "estop", "episode",
]  # fmt: skip

MAX_VALUES_PER_MESSAGE = 1000
MAX_KEY_LENGTH = 200
MAX_EVENT_DATA_CHARS = 64 * 1024
MAX_MESSAGE_CHARS = 256 * 1024
MAX_ERROR_CHARS = 8000
MAX_SEQ = 2**63 - 1  # the database's bigint
# Any integer anywhere in a message (event data too) lies within ±MAX_INTEGER: what the
# database's bigint, the channel layer (msgpack) and the pages' JSON readers all take.
MAX_INTEGER = 2**63 - 1
MAX_PROGRESS = 2**31 - 1
# Wall times (Unix seconds) lie in 0..MAX_WALL_TIME, 9999-12-31 23:59:59 UTC: the last
# second Python's datetime can show (JavaScript's Date reaches further).
MAX_WALL_TIME = 253_402_300_799.0
# Lists and objects nest at most this deep in a message (event data: a few levels).
MAX_NESTING = 64
# A trainer has at most this many messages sent and not yet answered (ack or error); a
# link with more waiting at the control plane is closed (CLOSE_TOO_MANY_IN_FLIGHT).
MAX_IN_FLIGHT = 256
# Distinct metric keys one run may have. A LIBERO-90 run with 4 planning horizons makes
# about 1,040 (per task and horizon: counts/task<T>/h<H>/{episodes,successes}); past the
# cap new keys are refused, values of the run's existing keys still stored.
MAX_METRIC_KEYS_PER_RUN = 4096
# The link is closed with this code when more than MAX_IN_FLIGHT messages wait for their
# answer: a policy violation, like 1008 (daphne lets an application close only with 1000
# or 3000-4999). Not a 44xx code, so a trainer reconnects and resends.
CLOSE_TOO_MANY_IN_FLIGHT = 4008

# Metric keys are TensorBoard-tag-like: safe in any page, URL, file name or chart label.
METRIC_KEY_RULE = (
    f"metric keys may hold only letters, digits and _ - . / : (1 to {MAX_KEY_LENGTH} characters)"
)
METRIC_KEY_PATTERN = rf"^[A-Za-z0-9_\-./:]{{1,{MAX_KEY_LENGTH}}}$"
_METRIC_KEY = re.compile(METRIC_KEY_PATTERN)


def is_metric_key(key: object) -> bool:
    """Whether `key` follows METRIC_KEY_RULE."""
    return isinstance(key, str) and _METRIC_KEY.fullmatch(key) is not None


# Checked by pydantic's own (compiled) pattern match; its error is told as METRIC_KEY_RULE.
MetricKey = Annotated[str, StringConstraints(pattern=METRIC_KEY_PATTERN)]
MetricValues = dict[MetricKey, float]
WallTime = Annotated[float, Field(ge=0, le=MAX_WALL_TIME)]


def storable_problem(data: Any) -> str | None:
    """What in parsed JSON `data` no reader of a message can take, as `path: problem`,
    or None: text PostgreSQL cannot store (NUL, a lone surrogate, as `\\u0000` and
    `\\udcff` escapes decode to) in any string or key at any depth, an integer beyond
    ±MAX_INTEGER, or nesting deeper than MAX_NESTING. Walked without recursion."""
    if not isinstance(data, dict | list):
        return None
    # Containers only go on the stack, with their path. Each is first looked at whole, in
    # C loops (all its keys as one string, the set of its values' types), and walked item
    # by item only where that finds something to check: a metrics message is one object
    # of up to 1000 keys and numbers.
    stack: list[tuple[tuple[Any, ...], Any]] = [((), data)]
    while stack:
        path, container = stack.pop()
        if len(path) >= MAX_NESTING:
            return f"{_where(path)}: nests deeper than {MAX_NESTING} levels"
        if isinstance(container, dict):
            if _unstorable("".join(map(str, container))):
                key = next(k for k in container if _unstorable(str(k)))
                return f"{_where((*path, key, '[key]'))}: {unstorable_message(str(key))}"
            items, kinds = container.items(), set(map(type, container.values()))
        else:
            items, kinds = enumerate(container), set(map(type, container))
        if not kinds & _TO_LOOK_AT:
            continue
        for key, value in items:
            if isinstance(value, str):
                if _unstorable(value):
                    return f"{_where((*path, key))}: {unstorable_message(value)}"
            elif isinstance(value, int) and not isinstance(value, bool):
                if not -MAX_INTEGER <= value <= MAX_INTEGER:
                    return f"{_where((*path, key))}: integers must lie within ±{MAX_INTEGER}"
            elif isinstance(value, dict | list):
                stack.append(((*path, key), value))
    return None


def _unstorable(text: str) -> bool:
    """Whether UNSTORABLE matches `text`, quickly: ASCII text (known at once) can only
    hold a NUL, and only text with a lone surrogate fails to encode as UTF-8."""
    if "\x00" in text:
        return True
    if text.isascii():
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


# Values whose type needs a closer look (floats, booleans and null need none).
_TO_LOOK_AT = frozenset({str, int, dict, list})


_PLAIN = re.compile(r"[A-Za-z0-9_\-/:]{1,40}")


def _where(path: tuple[Any, ...] | list[Any]) -> str:
    """A location as `values.loss` or `data.tasks.1.name`. A part that is not plain text
    (any key a sender chose) is shown cut short and escaped, `values.'loss\\x00x'`, so an
    error never carries markup or unstorable text whole."""
    parts = [_part(part) for part in path]
    if len(parts) > 8:  # deep nesting: its start and its end say where
        parts = [*parts[:3], "…", *parts[-3:]]
    return ".".join(parts) or "message"


def _part(part: Any) -> str:
    if isinstance(part, int):
        return str(part)
    text = str(part)
    return text if text == "[key]" or _PLAIN.fullmatch(text) else ascii(text[:30])


class _Message(BaseModel):
    # strict: no "1" for 1, no true for 1; NaN and infinity are not numbers here.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)

    v: Literal[1] = PROTOCOL_VERSION
    seq: int = Field(ge=1, le=MAX_SEQ)

    @model_validator(mode="before")
    @classmethod
    def _storable(cls, data: Any) -> Any:
        problem = storable_problem(data)
        if problem is not None:
            raise ValueError(problem)
        return data

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
        if self.kind == "estop":
            _check(EstopData, self.data, "data")
        if self.kind == "episode":
            _check(EpisodeData, self.data, "data")
        if self.kind != "finished":
            return self
        summary = self.data.get("summary")
        if not isinstance(summary, dict):
            raise ValueError("a finished event needs data.summary, an object of numbers")
        _check(_SUMMARY, summary, "data.summary")
        return self


def _message(issue: dict[str, Any]) -> str:
    """Pydantic's message for one problem; a metric key's as the rule it breaks."""
    if issue["type"] == "string_pattern_mismatch" and (
        issue.get("ctx", {}).get("pattern") == METRIC_KEY_PATTERN
    ):
        return METRIC_KEY_RULE
    return issue["msg"].removeprefix("Value error, ")


def _check(schema: type[BaseModel] | TypeAdapter, data: Any, where: str) -> None:
    """Validate `data` against `schema`; a ValueError naming each field that is wrong."""
    try:
        if isinstance(schema, TypeAdapter):
            schema.validate_python(data)
        else:
            schema.model_validate(data)
    except ValidationError as error:
        problems = "; ".join(
            f"{_where((*where.split('.'), *issue['loc']))}: {_message(issue)}"
            for issue in error.errors(include_url=False)[:5]
        )
        raise ValueError(problems) from None


class Metrics(_Message):
    type: Literal["metrics"] = "metrics"
    step: int = Field(ge=0, le=MAX_SEQ)
    time: WallTime
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
    started: WallTime  # time.time() on the trainer
    ended: WallTime
    steps: Count
    reason: str = Field(max_length=200)

    @model_validator(mode="after")
    def _ended_after_started(self) -> TakeoverData:
        if self.ended < self.started:
            raise ValueError("ended must not be before started")
        return self


class EstopData(_Strict):
    """An `estop` event's data: an e-stop pressed or cleared, for the audit."""

    action: Literal["pressed", "cleared"]
    operator: str = Field(min_length=1, max_length=150)
    robot: Count
    robot_name: str = Field(max_length=150)
    at: WallTime  # time.time() on the trainer
    stopped_by: str | None = Field(None, max_length=150)  # cleared: who had pressed it
    override: bool = False  # cleared by an admin, not by who pressed it


# An episode's steps: each with who acted and its reward (a few thousand at most: an
# episode is at most env.max_episode_steps decisions).
MAX_EPISODE_STEPS = 4096


class EpisodeData(_Strict):
    """An `episode` event's data: one recorded episode video (trainer.videos), as the
    line of the run's `videos/index.jsonl`."""

    name: str = Field(pattern=r"^[A-Za-z0-9_-]{1,100}$")
    file: str = Field(pattern=r"^[A-Za-z0-9_-]{1,100}\.mp4$")
    task: Count
    task_name: str = Field("", max_length=500)
    success: bool
    # "return" is a Python keyword: the field keeps the record's own name.
    episode_return: float = Field(alias="return")
    length: Count
    actors: list[Literal["policy", "human", "held"]] = Field(max_length=MAX_EPISODE_STEPS)
    rewards: list[float] = Field(max_length=MAX_EPISODE_STEPS)
    human_steps: Count
    bytes: Count
    iteration: Count | None = None
    init_state: Count | None = None
    horizon: Count | None = None

    @model_validator(mode="after")
    def _file_is_its_name(self) -> EpisodeData:
        if self.file != f"{self.name}.mp4":
            raise ValueError("file must be the episode's name followed by .mp4")
        if len(self.actors) != self.length or len(self.rewards) != self.length:
            raise ValueError("actors and rewards must have one entry per step (length)")
        return self


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
        raise InvalidMessage(
            f"message longer than {MAX_MESSAGE_CHARS} characters", _leading_seq(text)
        )
    try:
        # json.loads reads NaN, Infinity and 1e999 as floats: the models refuse them.
        data = json.loads(text)
    except ValueError as error:
        raise InvalidMessage(f"not JSON: {error}") from None
    except RecursionError:
        raise InvalidMessage(f"not JSON this reader takes: nests deeper than {MAX_NESTING}"
                             " levels") from None  # fmt: skip
    if not isinstance(data, dict):
        raise InvalidMessage("a message must be a JSON object")
    seq = data.get("seq")
    seq = seq if type(seq) is int and 1 <= seq <= MAX_SEQ else None
    try:
        return _MESSAGE.validate_python(data)
    except ValidationError as error:
        raise InvalidMessage(_describe(error), seq) from None


# How the trainer's own messages begin (`model_dump_json` writes `v`, then `seq`).
_LEADING_SEQ = re.compile(r'\{"v":\s*1,\s*"seq":\s*([1-9][0-9]{0,18})[,}]')


def _leading_seq(text: str) -> int | None:
    """The seq of a frame too long to parse, when it opens as the trainer's messages do,
    so the trainer learns which of its messages was refused."""
    found = _LEADING_SEQ.match(text[:64])
    seq = int(found.group(1)) if found else None
    return seq if seq is not None and seq <= MAX_SEQ else None


def _describe(error: ValidationError) -> str:
    """Pydantic's errors as one line each: `values.loss: Input should be a finite number`."""
    lines = []
    for issue in error.errors(include_url=False)[:5]:
        # The first element of the location names the union member; the rest the field.
        # A check of the whole message names its own path (storable_problem).
        message = _message(issue)
        lines.append(f"{_where(issue['loc'][1:])}: {message}" if issue["loc"][1:] else message)
    return "; ".join(lines)[:MAX_ERROR_CHARS]


class Reply(BaseModel):
    """What the server answers: ``ack`` once a message is stored (or was already), or
    ``error`` for a message it will never accept (resending it is pointless). An ack may
    carry a ``warning``: the message was stored, but not all of it (e.g. metric keys past
    MAX_METRIC_KEYS_PER_RUN)."""

    type: Literal["ack", "error"]
    seq: int | None = None
    error: str = ""
    warning: str = ""

    def payload(self) -> str:
        return self.model_dump_json(exclude_defaults=False)


def parse_reply(data: Any) -> Reply | None:
    """A server reply, or None for anything this version does not know (ignored)."""
    if not isinstance(data, dict) or data.get("type") not in ("ack", "error"):
        return None
    seq = data.get("seq")
    if not (isinstance(seq, int) and not isinstance(seq, bool)):
        seq = None
    return Reply(
        type=data["type"], seq=seq, error=str(data.get("error", "")),
        warning=str(data.get("warning", "")),
    )  # fmt: skip


def finite_values(values: dict[str, float]) -> dict[str, float]:
    """The values the protocol can carry: finite numbers under valid keys.

    JSON has no NaN or infinity, so a diverged loss is left out here (the JSONL log on
    disk still has it) rather than getting the whole batch rejected. A key outside
    METRIC_KEY_RULE is left out too, with a warning the first time it is seen."""
    kept: dict[str, float] = {}
    refused: list[Any] = []
    for key, value in values.items():
        if not is_metric_key(key):
            refused.append(key)
        elif (
            isinstance(value, int | float) and not isinstance(value, bool)
            and math.isfinite(value)
        ):  # fmt: skip
            kept[key] = float(value)
    if refused:
        _warn_refused_keys(refused)
    return kept


_warned_keys: set[str] = set()
_MAX_WARNED_KEYS = 1000  # remembered to warn once each; past that, no more warnings


def _warn_refused_keys(keys: list[Any]) -> None:
    new = [ascii(key)[:60] for key in keys if ascii(key) not in _warned_keys]
    if not new or len(_warned_keys) >= _MAX_WARNED_KEYS:
        return
    _warned_keys.update(ascii(key) for key in keys)
    log.warning("link: metric keys left out (%s): %s", METRIC_KEY_RULE, ", ".join(new[:10]))


def metric_chunks(values: dict[str, float]) -> list[dict[str, float]]:
    """`finite_values` in chunks of at most MAX_VALUES_PER_MESSAGE."""
    items = list(finite_values(values).items())
    return [
        dict(items[start : start + MAX_VALUES_PER_MESSAGE])
        for start in range(0, len(items), MAX_VALUES_PER_MESSAGE)
    ]


def json_safe(value: Any, depth: int = 0) -> Any:
    """Event data made valid for the protocol: non-finite floats become null, keys
    strings, tuples lists and anything else its text; text a database cannot store gets
    U+FFFD in place of each such character, an integer past ±MAX_INTEGER and anything
    nested past MAX_NESTING become their text (an error report still goes)."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        if abs(value) <= MAX_INTEGER:
            return value
        # (Python refuses to write an integer of more than 4,300 digits as text.)
        return str(value)[:100] if value.bit_length() < 14_000 else "a huge integer"
    if isinstance(value, str):
        return UNSTORABLE.sub("\ufffd", value)
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if depth >= MAX_NESTING - 1 and isinstance(value, dict | list | tuple):
        return json_safe(str(value)[:1000])
    if isinstance(value, dict):
        return {json_safe(str(key)): json_safe(item, depth + 1) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(item, depth + 1) for item in value]
    return json_safe(str(value))
