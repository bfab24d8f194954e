"""The trainer link's bounds (docs/link-protocol.md, "Limits"): distinct metric keys per
run, messages in flight, and what a link holds in memory. With the real components:
both write paths of `telemetry.record_many` and spool ingest on the test database, the
consumer through the ASGI WebSocket application, a trainer's `TrainerLink` against a
live daphne."""

import asyncio
import json
import time

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib.auth import get_user_model
from django.db import connection, transaction
from rest_framework.test import APIClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from controlplane.realtime import local_links, trainer_consumer
from controlplane.realtime.routing import websocket_application
from controlplane.runs import telemetry
from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import MetricKey, MetricPoint, Run, RunEvent, TelemetryBatch
from controlplane.runs.spool_ingest import ingest_spools
from controlplane.runs.tokens import make_run_token, make_spool_key
from tests.runs import submitted_run
from trainer.link import protocol
from trainer.link.client import TrainerLink, websocket_url
from trainer.link.protocol import (
    CLOSE_TOO_MANY_IN_FLIGHT,
    MAX_IN_FLIGHT,
    MAX_METRIC_KEYS_PER_RUN,
    Metrics,
)
from trainer.link.spool import SPOOL_FOLDER, Spool

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


@pytest.fixture
def run() -> Run:
    return submitted_run("limits")


def metrics(seq: int, values: dict[str, float], step: int = 1) -> dict:
    return {"v": 1, "type": "metrics", "seq": seq, "step": step, "time": 1.7e9, "values": values}


def count_keys(first: int, how_many: int) -> dict[str, float]:
    """Distinct task × horizon count keys, as a trainer of many tasks makes them."""
    return {
        f"counts/task{i // 8}/h{i % 8 + 1}/{'episodes' if i % 2 else 'successes'}": 1.0
        for i in range(first, first + how_many)
    }


def fill_keys(run: Run, how_many: int) -> None:
    MetricKey.objects.bulk_create(MetricKey(run=run, name=f"old/{i}") for i in range(how_many))


def stored_keys(run: Run) -> set[str]:
    return set(MetricKey.objects.filter(run=run).values_list("name", flat=True))


def points(run: Run, seq_step: int) -> set[str]:
    stored = MetricPoint.objects.filter(key__run=run, step=seq_step)
    return set(stored.values_list("key__name", flat=True))


def refusal_events(run: Run) -> list[RunEvent]:
    return list(RunEvent.objects.filter(run=run, kind=telemetry.REFUSED_KEYS_EVENT))


# ---- metric keys per run -----------------------------------------------------------


def test_keys_past_the_cap_are_refused_on_either_write_path(run):
    known: dict[str, int] = {}  # as one link's cache
    for seq in range(1, 5):  # 4,000 keys: under the cap
        batch = [metrics(seq, count_keys(1000 * (seq - 1), 1000), step=seq)]
        assert telemetry.record_many(run.pk, batch, known_keys=known) == [True]
    assert len(stored_keys(run)) == 4000 and not refusal_events(run)

    # Metrics alone: on PostgreSQL the one-statement path. 10 known keys, 200 new ones:
    # 96 fit under the cap, in the order sent; 104 are refused.
    refused: set[str] = set()
    over = metrics(5, {**count_keys(0, 10), **count_keys(4000, 200)}, step=5)
    assert telemetry.record_many(run.pk, [over], known_keys=known, refused_keys=refused) == [True]
    assert len(stored_keys(run)) == MAX_METRIC_KEYS_PER_RUN == 4096
    assert refused == set(count_keys(4096, 104))
    assert points(run, 5) == set(count_keys(0, 10)) | set(count_keys(4000, 96))

    # With a progress message: the transaction path; a fresh cache, as another link's.
    refused = set()
    mixed = [
        metrics(6, {**count_keys(0, 5), "late/a": 1.0, "late/b": 2.0}, step=6),
        {"v": 1, "type": "progress", "seq": 7, "step": 6, "total": 9},
    ]
    assert telemetry.record_many(run.pk, mixed, refused_keys=refused) == [True, True]
    assert refused == {"late/a", "late/b"}
    assert points(run, 6) == set(count_keys(0, 5))
    assert Run.objects.get(pk=run.pk).progress_step == 6
    assert len(stored_keys(run)) == MAX_METRIC_KEYS_PER_RUN

    (event,) = refusal_events(run)  # one warning for the run, however often it happens
    assert "the run has 4096 keys, the most a run may have (MAX_METRIC_KEYS_PER_RUN)" in (
        event.message
    )
    assert event.data["cap"] == 4096
    assert event.data["keys"] == sorted(count_keys(4096, 104))[:20]


def task_count_keys(first: int, how_many: int) -> dict[str, float]:
    """Per-task count keys: each pair is one more task charted by /success."""
    return {
        f"counts/task{i // 2}/{'episodes' if i % 2 else 'successes'}": 1.0
        for i in range(first, first + how_many)
    }


def test_the_success_answer_stays_bounded_however_many_keys_a_trainer_sends(run):
    """Before the cap, 40 messages of 1,000 new per-task count keys made 40,000 keys and
    a 5.7 MB answer from /success."""
    for seq in range(1, 41):
        values = task_count_keys(1000 * (seq - 1), 1000)
        telemetry.record_many(run.pk, [metrics(seq, values, step=seq)])
    assert len(stored_keys(run)) == MAX_METRIC_KEYS_PER_RUN
    viewer = APIClient()
    viewer.force_authenticate(get_user_model().objects.create_user("vic"))
    response = viewer.get(f"/api/v1/runs/{run.pk}/success")
    assert response.status_code == 200
    size = len(response.content)
    print(f"/success with {MAX_METRIC_KEYS_PER_RUN} count keys: {size} bytes")
    assert size < 1_000_000


def test_spool_ingest_keeps_to_the_key_cap(run):
    fill_keys(run, MAX_METRIC_KEYS_PER_RUN - 1)
    folder = run_artifact_dir(run.pk) / SPOOL_FOLDER
    spool = Spool(folder, run.attempt, key=make_spool_key(run.pk, run.attempt))
    values = {"old/0": 1.0, "new/a": 2.0, "new/b": 3.0}
    spool.append(Metrics(seq=1, step=7, time=1.7e9, values=values).payload())
    spool.close()
    ingest_spools(run)
    assert len(stored_keys(run)) == MAX_METRIC_KEYS_PER_RUN
    assert points(run, 7) == {"old/0", "new/a"}
    (event,) = refusal_events(run)
    assert event.data["keys"] == ["new/b"]


# ---- through the link ----------------------------------------------------------------


async def connected(run: Run) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {make_run_token(run.pk)}".encode())]
    socket = WebsocketCommunicator(websocket_application, f"/ws/trainer/{run.pk}/", headers)
    ok, code = await socket.connect()
    assert ok, code
    return socket


async def exchange(socket: WebsocketCommunicator, message: dict) -> dict:
    await socket.send_to(text_data=json.dumps(message))
    return json.loads(await socket.receive_from(timeout=10))


async def test_the_trainer_is_told_which_new_keys_were_not_stored(run):
    await database_sync_to_async(fill_keys)(run, MAX_METRIC_KEYS_PER_RUN - 1)
    socket = await connected(run)
    reply = await exchange(socket, metrics(1, {"old/0": 0.5, "new/a": 1.0, "new/b": 2.0}))
    assert reply["type"] == "ack" and reply["seq"] == 1  # stored: not to be resent
    assert reply["warning"].startswith("1 new metric keys not stored: the run has 4096 keys")
    assert reply["warning"].endswith("Refused: new/b")
    again = await exchange(socket, metrics(2, {"old/1": 0.5, "new/c": 1.0}, step=2))
    assert again["warning"].endswith("Refused: new/c")
    assert await exchange(socket, metrics(3, {"old/2": 0.5}, step=3)) == {"type": "ack", "seq": 3}
    assert await database_sync_to_async(points)(run, 1) == {"old/0", "new/a"}
    assert len(await database_sync_to_async(refusal_events)(run)) == 1
    await socket.disconnect()


async def test_a_flood_of_messages_is_cut_off_and_what_waits_stays_bounded(run):
    """A sender that does not wait for answers: 10,000 messages at once. The link is
    closed as soon as more than MAX_IN_FLIGHT wait, and no more are read."""
    socket = await connected(run)
    (consumer,) = local_links.of_run(run.pk)
    flood = 10_000
    for seq in range(1, flood + 1):
        await socket.send_to(text_data=json.dumps(metrics(seq, {"rollout/success_rate": 0.5})))
    acked = 0
    while (output := await socket.receive_output(timeout=30))["type"] != "websocket.close":
        assert json.loads(output["text"])["type"] == "ack"
        acked += 1
    assert output["code"] == CLOSE_TOO_MANY_IN_FLIGHT
    assert consumer.most_unanswered == MAX_IN_FLIGHT + 1  # the bound, never more
    assert consumer.inbox == []
    stored = await database_sync_to_async(TelemetryBatch.objects.filter(run=run).count)()
    print(f"flood of {flood}: at most {consumer.most_unanswered} waited, {acked} acked, "
          f"{stored} stored")  # fmt: skip
    # Nothing was read after the close: what is stored was acked, or waiting then.
    assert acked <= stored <= acked + MAX_IN_FLIGHT + 1


async def test_broadcasts_waiting_on_a_stalled_channel_layer_stay_bounded(run, monkeypatch):
    """The channel layer stalls while a trainer streams (window by window): stored
    messages waiting to be broadcast stay at MAX_OUTBOX, the oldest skipped; what is
    stored is all there, and the broadcasts resume once the layer does."""
    stalled = asyncio.Event()
    published: list[dict] = []
    real_publish = trainer_consumer.publish_async

    async def stalling_publish(group: str, event: dict) -> None:
        await stalled.wait()
        published.append(event)
        await real_publish(group, event)

    monkeypatch.setattr(trainer_consumer, "publish_async", stalling_publish)
    socket = await connected(run)
    (consumer,) = local_links.of_run(run.pk)
    sent = 3 * MAX_IN_FLIGHT
    for first in range(1, sent + 1, MAX_IN_FLIGHT):  # a window, then its answers
        window = range(first, first + MAX_IN_FLIGHT)
        for seq in window:
            await socket.send_to(text_data=json.dumps(metrics(seq, {"a": 1.0}, step=seq)))
        for _ in window:
            assert json.loads(await socket.receive_from(timeout=10))["type"] == "ack"
        assert len(consumer.outbox) <= trainer_consumer.MAX_OUTBOX
    stored = await database_sync_to_async(TelemetryBatch.objects.filter(run=run).count)()
    assert stored == sent
    stalled.set()
    while consumer.outbox or (consumer.broadcaster and not consumer.broadcaster.done()):
        await asyncio.sleep(0.01)
    last = published[-1]
    seqs = [e["seq"] for e in last.get("events", [last])]
    assert seqs[-1] == sent  # the newest were broadcast
    await socket.disconnect()


def test_an_honest_trainer_with_a_slow_database_is_never_cut_off(web, caplog):
    """The database takes every write lock for seconds while the trainer sends three
    windows' worth: the trainer keeps MAX_IN_FLIGHT in flight and waits; the link stays
    up throughout and everything is stored once the database is back."""
    run = submitted_run("slow-database")
    link = TrainerLink(web.url, run.pk, make_run_token(run.pk))
    sent = 3 * MAX_IN_FLIGHT
    with transaction.atomic():  # on SQLite an IMMEDIATE transaction: the write lock
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(f"LOCK TABLE {TelemetryBatch._meta.db_table} IN EXCLUSIVE MODE")
        for step in range(1, sent + 1):
            link.progress(step, sent)
        time.sleep(3)
        assert link.pending() == sent  # nothing could be stored meanwhile
    assert link.close(timeout=120) is True
    assert TelemetryBatch.objects.filter(run=run).count() == sent
    assert Run.objects.get(pk=run.pk).progress_step == sent
    assert "is down" not in caplog.text  # never closed, never reconnected


def test_a_flooding_sender_is_closed_by_a_live_web_server_with_the_documented_code(web):
    """The same flood against daphne, which lets an application close a socket only with
    1000 or 3000-4999: the sender gets CLOSE_TOO_MANY_IN_FLIGHT, not an error."""
    run = submitted_run("flood")
    headers = {"Authorization": f"Bearer {make_run_token(run.pk)}"}
    acked = 0
    with connect(websocket_url(web.url, run.pk), additional_headers=headers) as socket:
        with pytest.raises(ConnectionClosed) as closed:
            for seq in range(1, 5001):
                socket.send(json.dumps(metrics(seq, {"rollout/success_rate": 0.5})))
            while True:
                assert json.loads(socket.recv(timeout=30))["type"] == "ack"
                acked += 1
    assert closed.value.rcvd is not None
    assert closed.value.rcvd.code == CLOSE_TOO_MANY_IN_FLIGHT
    assert TelemetryBatch.objects.filter(run=run).count() <= acked + MAX_IN_FLIGHT + 1


def test_the_protocol_document_states_the_limits_the_code_keeps():
    text = (settings.BASE_DIR / "docs/link-protocol.md").read_text()
    for name, shown in [
        ("MAX_METRIC_KEYS_PER_RUN", "4096 distinct keys"),
        ("MAX_IN_FLIGHT", "256 sent on a connection"),
        ("CLOSE_TOO_MANY_IN_FLIGHT", "closed with **4008**"),
        ("MAX_WALL_TIME", "from 0 to 253402300799"),
        ("MAX_NESTING", "64 levels deep"),
        ("MAX_KEY_LENGTH", "1–200 characters"),
    ]:
        assert f"`{name}`" in text and shown in text
        assert str(int(getattr(protocol, name))) in shown
