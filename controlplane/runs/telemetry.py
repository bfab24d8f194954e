"""What a trainer reports over its link: who may report for a run, which messages are
valid (protocol v1, docs/link-protocol.md) and how each is stored, once per (run, seq).

The rules mirror trainer/link/protocol.py, which the control plane may not import;
tests/controlplane/runs/test_link_protocol_agreement.py checks the two agree.
"""

import enum
import json
import math
from typing import Any

from django.db import IntegrityError, transaction

from controlplane.realtime.groups import RUNS_LIST, run_group
from controlplane.runs.models import (
    FINAL_STATES,
    MetricPoint,
    Run,
    RunEvent,
    RunState,
    TelemetryBatch,
)
from controlplane.runs.state import IllegalTransition, transition
from controlplane.runs.tokens import run_id_from_token

PROTOCOL_VERSION = 1
EVENT_KINDS = frozenset({"started", "iteration", "checkpoint", "finished", "failed"})
MAX_VALUES_PER_MESSAGE = 1000
MAX_KEY_LENGTH = 200  # MetricPoint.key
MAX_EVENT_DATA_CHARS = 64 * 1024
MAX_MESSAGE_CHARS = 256 * 1024
MAX_SEQ = 2**63 - 1  # PositiveBigIntegerField
MAX_PROGRESS = 2**31 - 1  # PositiveIntegerField

FIELDS = {
    "event": {"v", "type", "seq", "kind", "data"},
    "metrics": {"v", "type", "seq", "step", "time", "values"},
    "progress": {"v", "type", "seq", "step", "total"},
}


class Refusal(enum.Enum):
    """Why a link is not opened."""

    NO_TOKEN = "no valid run token"
    WRONG_RUN = "the token is for another run"
    NO_SUCH_RUN = "no such run"
    RUN_FINISHED = "the run has finished"


def link_refusal(run_id: int, token: str | None) -> Refusal | None:
    """None when `token` lets its bearer report for run `run_id`."""
    token_run = run_id_from_token(token) if token else None
    if token_run is None:
        return Refusal.NO_TOKEN
    if token_run != run_id:
        return Refusal.WRONG_RUN
    run = Run.objects.filter(pk=run_id).only("state").first()
    if run is None:
        return Refusal.NO_SUCH_RUN
    if run.is_final:
        return Refusal.RUN_FINISHED
    return None


def run_is_final(run_id: int) -> bool:
    """A run token is spent once its run is final (or gone)."""
    return not Run.objects.filter(pk=run_id).exclude(state__in=FINAL_STATES).exists()


class InvalidMessage(ValueError):
    def __init__(self, error: str, seq: int | None = None):
        super().__init__(error)
        self.error, self.seq = error, seq


def parse_message(text: str) -> dict[str, Any]:
    """The message in `text`, checked field by field; raises InvalidMessage naming what
    is wrong (with the message's seq when it has a valid one)."""
    if len(text) > MAX_MESSAGE_CHARS:
        raise InvalidMessage(f"message longer than {MAX_MESSAGE_CHARS} characters")
    try:
        message = json.loads(text)
    except ValueError as error:
        raise InvalidMessage(f"not JSON: {error}") from None
    if not isinstance(message, dict):
        raise InvalidMessage("a message must be a JSON object")
    seq = message.get("seq")
    if not _is_int(seq) or not 1 <= seq <= MAX_SEQ:
        raise InvalidMessage("seq must be a positive integer")
    try:
        _check(message)
    except InvalidMessage as error:
        error.seq = seq
        raise
    return message


def _check(message: dict[str, Any]) -> None:
    if message.get("v") != PROTOCOL_VERSION or not _is_int(message.get("v")):
        raise InvalidMessage(f"v must be {PROTOCOL_VERSION}, the protocol version")
    kind = message.get("type")
    if kind not in FIELDS:
        raise InvalidMessage(f"unknown type {kind!r}; expected one of {sorted(FIELDS)}")
    missing = FIELDS[kind] - message.keys()
    unknown = message.keys() - FIELDS[kind]
    if missing or unknown:
        raise InvalidMessage(
            f"{kind}: " + "; ".join(
                part for part in (
                    f"missing {sorted(missing)}" if missing else "",
                    f"unknown fields {sorted(unknown)}" if unknown else "",
                ) if part
            )
        )  # fmt: skip
    if kind == "event":
        _check_event(message["kind"], message["data"])
    elif kind == "metrics":
        _check_step(message["step"], "step", MAX_SEQ)
        if not _is_finite_number(message["time"]) or message["time"] < 0:
            raise InvalidMessage("time must be a finite number of seconds since the epoch")
        _check_values(message["values"], "values", allow_empty=False)
    else:
        _check_step(message["step"], "step", MAX_PROGRESS)
        _check_step(message["total"], "total", MAX_PROGRESS)
        if message["step"] > message["total"]:
            raise InvalidMessage("step must not exceed total")


def _check_event(kind: Any, data: Any) -> None:
    if kind not in EVENT_KINDS:
        raise InvalidMessage(f"unknown event kind {kind!r}; expected one of {sorted(EVENT_KINDS)}")
    if not isinstance(data, dict):
        raise InvalidMessage("data must be an object")
    if not _all_finite(data):
        raise InvalidMessage("data holds a non-finite number (NaN or infinity)")
    if len(json.dumps(data)) > MAX_EVENT_DATA_CHARS:
        raise InvalidMessage(f"data longer than {MAX_EVENT_DATA_CHARS} characters")
    if kind == "finished":
        if "summary" not in data:
            raise InvalidMessage("a finished event needs data.summary")
        _check_values(data["summary"], "data.summary", allow_empty=True)


def _check_values(values: Any, where: str, allow_empty: bool) -> None:
    if not isinstance(values, dict) or (not values and not allow_empty):
        raise InvalidMessage(f"{where} must be a non-empty object of numbers")
    if len(values) > MAX_VALUES_PER_MESSAGE:
        raise InvalidMessage(f"{where} has {len(values)} entries; at most {MAX_VALUES_PER_MESSAGE}")
    for key, value in values.items():
        if not 0 < len(key) <= MAX_KEY_LENGTH:
            raise InvalidMessage(f"{where}: keys must have 1 to {MAX_KEY_LENGTH} characters")
        if not _is_finite_number(value):
            raise InvalidMessage(f"{where}[{key!r}] must be a finite number, not {value!r}")


def _check_step(value: Any, name: str, maximum: int) -> None:
    if not _is_int(value) or not 0 <= value <= maximum:
        raise InvalidMessage(f"{name} must be an integer from 0 to {maximum}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_finite_number(value: Any) -> bool:
    # json.loads reads NaN, Infinity and 1e999 as floats: they must be refused here.
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _all_finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(_all_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_all_finite(item) for item in value)
    return True


def record(run_id: int, message: dict[str, Any]) -> bool:
    """Store a valid message in one transaction. False when this (run, seq) was stored
    before: a resend, to be acknowledged again but not stored twice."""
    seq, kind = message["seq"], message["type"]
    with transaction.atomic():
        try:
            with transaction.atomic():
                TelemetryBatch.objects.create(run_id=run_id, seq=seq, kind=kind)
        except IntegrityError:
            if TelemetryBatch.objects.filter(run_id=run_id, seq=seq).exists():
                return False
            raise  # not a duplicate (e.g. the run is gone): let the caller see it
        STORE[kind](run_id, message)
    return True


def _store_metrics(run_id: int, message: dict[str, Any]) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(
            run_id=run_id, key=key, step=message["step"], value=value, wall_time=message["time"]
        )
        for key, value in message["values"].items()
    )


def _store_progress(run_id: int, message: dict[str, Any]) -> None:
    Run.objects.filter(pk=run_id).update(
        progress_step=message["step"], progress_total=message["total"]
    )


def _store_event(run_id: int, message: dict[str, Any]) -> None:
    kind, data = message["kind"], message["data"]
    RunEvent.objects.create(run_id=run_id, kind=kind, message=str(data.get("error", "")), data=data)
    if kind == "started":
        try:
            transition(run_id, RunState.RUNNING, "the trainer started")
        except IllegalTransition:  # already running, or finished meanwhile
            pass
    elif kind == "finished":
        # Only the summary: the final state comes from the Ray job's status (reconcile).
        Run.objects.filter(pk=run_id).update(summary=data["summary"])


STORE = {"metrics": _store_metrics, "progress": _store_progress, "event": _store_event}


def broadcast_messages(run_id: int, message: dict[str, Any]) -> list[tuple[str, dict]]:
    """The (group, channel-layer message) pairs that tell browsers about a stored message:
    everything to the run's group, progress also to the runs list's progress bars."""
    kind = message["type"]
    if kind == "metrics":
        body = {"step": message["step"], "time": message["time"], "values": message["values"]}
    elif kind == "progress":
        body = {"step": message["step"], "total": message["total"]}
    else:
        body = {"kind": message["kind"], "data": message["data"]}
    out = {"type": f"run.{kind}", "run": run_id, "seq": message["seq"], **body}
    groups = [run_group(run_id)] + ([RUNS_LIST] if kind == "progress" else [])
    return [(group, out) for group in groups]
