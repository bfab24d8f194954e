"""What a trainer reports over its link: who may report for a run, which messages are
valid (protocol v1, docs/link-protocol.md) and how each is stored, once per
(run, attempt, seq).

Messages are validated with trainer/link/protocol.py, the protocol's one schema (pure
pydantic), which the trainer builds its messages with.
"""

import enum
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from controlplane.realtime.groups import RUNS_LIST, run_group
from controlplane.runs.metric_points import copy_points, point_rows
from controlplane.runs.models import (
    MetricPoint,
    Run,
    RunEvent,
    RunState,
    TelemetryBatch,
)
from controlplane.runs.state import try_transition
from controlplane.runs.tokens import read_run_token
from trainer.link import protocol
from trainer.link.protocol import MAX_METRIC_KEYS_PER_RUN, InvalidMessage

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
    run = Run.objects.filter(pk=run_id).only("state", "attempt", "job_ended").first()
    if run is None:
        return Refusal.NO_SUCH_RUN
    if claims.attempt != run.attempt:
        return Refusal.OLD_ATTEMPT
    if not run.takes_reports:
        return Refusal.RUN_FINISHED
    return None


def link_attempt(token: str) -> int:
    """The attempt a token that `link_refusal` accepted reports for."""
    claims = read_run_token(token)
    assert claims is not None
    return claims.attempt


def run_is_final(run_id: int) -> bool:
    """A run token is spent once its run no longer takes reports (or is gone)."""
    run = Run.objects.filter(pk=run_id).only("state", "job_ended").first()
    return run is None or not run.takes_reports


def parse_message(text: str) -> dict[str, Any]:
    """The message in one text frame, validated by the protocol's own schema (the same
    models the trainer builds its messages with); raises InvalidMessage."""
    return protocol.parse_message(text).model_dump()


def record(
    run_id: int,
    message: dict[str, Any],
    attempt: int = 1,
    moves_state: bool = True,
    known_keys: dict[str, int] | None = None,
) -> bool:
    """Store one valid message (see `record_many`). False when this (run, attempt, seq)
    was stored before: a resend, to be acknowledged again but not stored twice."""
    return record_many(run_id, [message], attempt, moves_state, known_keys)[0]


def record_many(
    run_id: int,
    messages: list[dict[str, Any]],
    attempt: int = 1,
    moves_state: bool = True,
    known_keys: dict[str, int] | None = None,
    refused_keys: set[str] | None = None,
) -> list[bool]:
    """Store valid messages, in order, in one transaction (one commit, however many
    arrived together); for each, whether it was new (False: stored before, a resend).

    `moves_state=False` stores an earlier attempt's events without letting them change
    the run's state (its spool, ingested late). `known_keys` caches the run's metric
    key rows across the messages of one link. A metric key the run does not have yet,
    once it has MAX_METRIC_KEYS_PER_RUN, is not stored (its values are left out, those
    of the run's other keys stored): its name goes into `refused_keys`, and the run gets
    one `telemetry_refused` event saying so."""
    refused: set[str] = set()
    new = _record_many(run_id, messages, attempt, moves_state, known_keys, refused)
    if refused:
        _note_refused_keys(run_id, refused)
        if refused_keys is not None:
            refused_keys.update(refused)
    return new


def _record_many(
    run_id: int,
    messages: list[dict[str, Any]],
    attempt: int,
    moves_state: bool,
    known_keys: dict[str, int] | None,
    refused: set[str],
) -> list[bool]:
    if _fits_one_statement(messages):
        return _record_points_in_one_statement(run_id, messages, attempt, known_keys, refused)
    with transaction.atomic():
        new = _claim_seqs(run_id, attempt, messages)
        points: list[tuple[int, int, float, float]] = []
        progress: dict[str, Any] | None = None
        for message in messages:
            if not new[message["seq"]]:
                continue
            kind = message["type"]
            if kind == "metrics":
                points += point_rows(
                    run_id, message["step"], message["time"], message["values"], known_keys,
                    refused,
                )  # fmt: skip
            elif kind == "progress":
                # Forward only, so the furthest of the batch is the one that counts: one
                # update, not one per message (a spool holds one per iteration).
                if progress is None or message["step"] >= progress["step"]:
                    progress = message
            else:
                # Points before a state change are stored with it, in the same order.
                copy_points(points)
                points = []
                _store_event(run_id, message, moves_state)
        copy_points(points)
        if progress is not None:
            _store_progress(run_id, progress)
    return [new[message["seq"]] for message in messages]


# Values per statement: bounded so one statement stays a modest size.
ONE_STATEMENT_MAX_VALUES = 20_000


def _fits_one_statement(messages: list[dict[str, Any]]) -> bool:
    """Metrics only, on PostgreSQL, and few enough values for one statement."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        return False
    if any(message["type"] != "metrics" for message in messages):
        return False
    values = sum(len(message["values"]) for message in messages)
    return len(messages) + values <= ONE_STATEMENT_MAX_VALUES


def _record_points_in_one_statement(
    run_id: int,
    messages: list[dict[str, Any]],
    attempt: int,
    known_keys: dict[str, int] | None,
    refused: set[str],
) -> list[bool]:
    """The common case, metrics messages only, in one round trip to the database: one
    statement claims the seqs and inserts the points of the newly claimed ones (a
    statement is its own transaction). A live link's writes wait on the database's
    round trips, not on its work, so fewer of them is what makes them fast."""
    points = [
        (message["seq"], *row)
        for message in messages
        for row in point_rows(
            run_id, message["step"], message["time"], message["values"], known_keys, refused
        )
    ]
    # Columns as arrays (unnest): the statement's text stays the same few lines whatever
    # the number of points, so the driver never re-parses a statement of thousands of
    # placeholders (that parsing was most of a write's time).
    columns = list(zip(*points, strict=True)) if points else [[], [], [], [], []]
    with connection.cursor() as cursor:
        cursor.execute(
            f"""WITH claimed AS (
                INSERT INTO {TelemetryBatch._meta.db_table}
                    (run_id, attempt, seq, kind, received_at)
                SELECT %s, %s, seq, 'metrics', %s FROM unnest(%s::bigint[]) AS seq
                ON CONFLICT (run_id, attempt, seq) DO NOTHING RETURNING seq
            ), stored AS (
                INSERT INTO {MetricPoint._meta.db_table} (key_id, step, value, wall_time)
                SELECT p.key_id, p.step, p.value, p.wall_time
                FROM unnest(%s::bigint[], %s::bigint[], %s::bigint[], %s::float8[],
                            %s::float8[]) AS p (seq, key_id, step, value, wall_time)
                WHERE p.seq IN (SELECT seq FROM claimed)
            )
            SELECT seq FROM claimed""",
            [run_id, attempt, timezone.now(), [m["seq"] for m in messages],
             *(list(column) for column in columns)],
        )  # fmt: skip
        claimed = {seq for (seq,) in cursor.fetchall()}
    return [message["seq"] in claimed for message in messages]


def _claim_seqs(run_id: int, attempt: int, messages: list[dict[str, Any]]) -> dict[int, bool]:
    """Insert each message's (run, attempt, seq) row unless it exists, in one statement:
    {seq: inserted now}. A missing run still fails (its foreign key), at the latest on
    commit."""
    kinds = {message["seq"]: message["type"] for message in messages}
    table = TelemetryBatch._meta.db_table
    rows = ", ".join(["(%s, %s, %s, %s, %s)"] * len(kinds))
    now = timezone.now()
    params = [v for seq, kind in kinds.items() for v in (run_id, attempt, seq, kind, now)]
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (run_id, attempt, seq, kind, received_at) VALUES {rows} "
            "ON CONFLICT (run_id, attempt, seq) DO NOTHING RETURNING seq",
            params,
        )
        inserted = {seq for (seq,) in cursor.fetchall()}
    return {seq: seq in inserted for seq in kinds}


REFUSED_KEYS_EVENT = "telemetry_refused"
REFUSED_KEYS_SHOWN = 20


def refused_keys_warning(names: set[str] | list[str]) -> str:
    """What a run's `telemetry_refused` event and the trainer's ack say about new metric
    keys past the cap."""
    shown = sorted(names)[:REFUSED_KEYS_SHOWN]
    more = f" and {len(names) - len(shown)} more" if len(names) > len(shown) else ""
    return (
        f"{len(names)} new metric keys not stored: the run has {MAX_METRIC_KEYS_PER_RUN} "
        "keys, the most a run may have (MAX_METRIC_KEYS_PER_RUN); values of its existing "
        f"keys are still stored. Refused: {', '.join(shown)}{more}"
    )


def _note_refused_keys(run_id: int, names: set[str]) -> None:
    """The run's one `telemetry_refused` event, made the first time keys are refused."""
    with transaction.atomic():
        # The run's row lock: two writers of one run cannot both make the first one.
        list(Run.objects.select_for_update(no_key=True).filter(pk=run_id).values_list("pk"))
        if RunEvent.objects.filter(run_id=run_id, kind=REFUSED_KEYS_EVENT).exists():
            return
        RunEvent.objects.create(
            run_id=run_id,
            kind=REFUSED_KEYS_EVENT,
            message=refused_keys_warning(names),
            data={"cap": MAX_METRIC_KEYS_PER_RUN, "keys": sorted(names)[:REFUSED_KEYS_SHOWN]},
        )


def ack(message: dict[str, Any], refused_keys: set[str]) -> dict[str, Any]:
    """The reply to a stored message; a warning when some of its metric keys were
    refused (`record_many`'s `refused_keys`), so the trainer knows."""
    reply: dict[str, Any] = {"type": "ack", "seq": message["seq"]}
    if refused_keys and message["type"] == "metrics":
        left_out = [key for key in message["values"] if key in refused_keys]
        if left_out:
            reply["warning"] = refused_keys_warning(left_out)
    return reply


def count_rejected(run_id: int, how_many: int = 1) -> None:
    """Messages the protocol refused: counted on the run, shown on its page."""
    Run.objects.filter(pk=run_id).update(link_rejected=F("link_rejected") + how_many)


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


def broadcast_batches(run_id: int, messages: list[dict[str, Any]]) -> list[tuple[str, dict]]:
    """`broadcast_messages` of several stored messages, one channel-layer event per group:
    a lone event as it is, several as one `run.batch` event carrying them in order (one
    publish instead of many, and one slot of a browser's channel capacity, not many)."""
    per_group: dict[str, list[dict]] = {}
    for message in messages:
        for group, event in broadcast_messages(run_id, message):
            per_group.setdefault(group, []).append(event)
    if RUNS_LIST in per_group:  # a list row is redrawn from the database: the last will do
        per_group[RUNS_LIST] = per_group[RUNS_LIST][-1:]
    return [
        (group, events[0] if len(events) == 1 else {"type": "run.batch", "events": events})
        for group, events in per_group.items()
    ]
