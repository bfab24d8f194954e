"""What a trainer reports over its link: who may report for a run, which messages are
valid (protocol v1, docs/link-protocol.md) and how each is stored, once per
(run, attempt, seq).

Messages are validated with trainer/link/protocol.py, the protocol's one schema (pure
pydantic), which the trainer builds its messages with.
"""

import enum
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from controlplane.realtime.groups import RUNS_LIST, run_group
from controlplane.runs.models import (
    ACTIVE_STATES,
    MetricPoint,
    Run,
    RunEvent,
    RunState,
    TelemetryBatch,
)
from controlplane.runs.state import try_transition
from controlplane.runs.tokens import read_run_token
from trainer.link import protocol
from trainer.link.protocol import InvalidMessage

__all__ = ["InvalidMessage", "Refusal", "link_refusal", "parse_message", "record"]


class Refusal(enum.Enum):
    """Why a link is not opened."""

    NO_TOKEN = "no valid run token"
    WRONG_RUN = "the token is for another run"
    OLD_ATTEMPT = "the token is for an earlier attempt of the run"
    NO_SUCH_RUN = "no such run"
    RUN_FINISHED = "the run has finished"


def link_refusal(run_id: int, token: str | None) -> Refusal | None:
    """None when `token` lets its bearer report for run `run_id` (its current attempt)."""
    claims = read_run_token(token) if token else None
    if claims is None:
        return Refusal.NO_TOKEN
    if claims.run_id != run_id:
        return Refusal.WRONG_RUN
    run = Run.objects.filter(pk=run_id).only("state", "attempt").first()
    if run is None:
        return Refusal.NO_SUCH_RUN
    if claims.attempt != run.attempt:
        return Refusal.OLD_ATTEMPT
    if not run.is_active:
        return Refusal.RUN_FINISHED
    return None


def link_attempt(token: str) -> int:
    """The attempt a token that `link_refusal` accepted reports for."""
    claims = read_run_token(token)
    assert claims is not None
    return claims.attempt


def run_is_final(run_id: int) -> bool:
    """A run token is spent once its run is no longer active (or gone)."""
    return not Run.objects.filter(pk=run_id, state__in=ACTIVE_STATES).exists()


def parse_message(text: str) -> dict[str, Any]:
    """The message in one text frame, validated by the protocol's own schema (the same
    models the trainer builds its messages with); raises InvalidMessage."""
    return protocol.parse_message(text).model_dump()


def record(
    run_id: int, message: dict[str, Any], attempt: int = 1, moves_state: bool = True
) -> bool:
    """Store a valid message in one transaction. False when this (run, attempt, seq) was
    stored before: a resend, to be acknowledged again but not stored twice.

    `moves_state=False` stores an earlier attempt's events without letting them change
    the run's state (its spool, ingested late)."""
    seq, kind = message["seq"], message["type"]
    with transaction.atomic():
        try:
            with transaction.atomic():
                TelemetryBatch.objects.create(run_id=run_id, attempt=attempt, seq=seq, kind=kind)
        except IntegrityError:
            if TelemetryBatch.objects.filter(run_id=run_id, attempt=attempt, seq=seq).exists():
                return False
            raise  # not a duplicate (e.g. the run is gone): let the caller see it
        if kind == "event":
            _store_event(run_id, message, moves_state)
        else:
            STORE[kind](run_id, message)
    return True


def count_rejected(run_id: int) -> None:
    """A message the protocol refused: counted on the run, shown on its page."""
    Run.objects.filter(pk=run_id).update(link_rejected=F("link_rejected") + 1)


def _store_metrics(run_id: int, message: dict[str, Any]) -> None:
    MetricPoint.objects.bulk_create(
        MetricPoint(
            run_id=run_id, key=key, step=message["step"], value=value, wall_time=message["time"]
        )
        for key, value in message["values"].items()
    )


def _store_progress(run_id: int, message: dict[str, Any]) -> None:
    # Forward only: a late resend, or a resumed attempt redoing iterations after its
    # checkpoint, must not move the bar back.
    Run.objects.filter(pk=run_id, progress_step__lte=message["step"]).update(
        progress_step=message["step"], progress_total=message["total"]
    )


def _store_event(run_id: int, message: dict[str, Any], moves_state: bool = True) -> None:
    kind, data = message["kind"], message["data"]
    RunEvent.objects.create(run_id=run_id, kind=kind, message=str(data.get("error", "")), data=data)
    if not moves_state:
        return
    # The trainer's own word moves the run at once; reconciling with Ray's job status
    # is the safety net for a trainer that dies without a word.
    if kind == "started":
        try_transition(run_id, RunState.RUNNING, "the trainer started")
    elif kind == "finished":
        Run.objects.filter(pk=run_id).update(summary=data["summary"])
        try_transition(run_id, RunState.SUCCEEDED, "the trainer finished")
    elif kind == "failed":
        run = Run.objects.only("cancel_requested_at").get(pk=run_id)
        if run.cancel_requested_at is None:  # a cancelled trainer dies as it is told
            try_transition(run_id, RunState.FAILED, str(data.get("error", "the trainer failed")))


STORE = {"metrics": _store_metrics, "progress": _store_progress}


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
