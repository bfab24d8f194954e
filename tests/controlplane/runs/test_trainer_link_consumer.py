"""The control plane's end of the trainer link, through the real ASGI WebSocket
application: who may connect, what is stored (once), acknowledged and broadcast."""

import json

import pytest
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.conf import settings

from controlplane.experiments.services import create_experiment
from controlplane.realtime.consumers import CLOSE_UNAUTHENTICATED
from controlplane.realtime.groups import RUNS_LIST, run_group
from controlplane.realtime.routing import websocket_application
from controlplane.realtime.trainer_consumer import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND
from controlplane.runs.models import MetricPoint, Run, RunEvent, RunState, TelemetryBatch
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from trainer.link.protocol import MAX_WALL_TIME, METRIC_KEY_RULE

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.embedded]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


def make_run(state: RunState = RunState.SUBMITTING) -> Run:
    experiment = create_experiment(f"link-{Run.objects.count()}", CONFIG)
    run = Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml=CONFIG
    )
    for step in {
        RunState.QUEUED: [],
        RunState.SUBMITTING: [RunState.SUBMITTING],
        RunState.RUNNING: [RunState.SUBMITTING, RunState.RUNNING],
        RunState.CANCELLED: [RunState.CANCELLED],
    }[state]:
        transition(run.pk, step)
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def run() -> Run:
    return make_run()


def link(run_id: int, token: str | None) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())] if token is not None else []
    return WebsocketCommunicator(websocket_application, f"/ws/trainer/{run_id}/", headers=headers)


async def connected(run: Run) -> WebsocketCommunicator:
    socket = link(run.pk, make_run_token(run.pk))
    ok, code = await socket.connect()
    assert ok, code
    return socket


async def exchange(socket: WebsocketCommunicator, message: dict | str) -> dict:
    await socket.send_to(text_data=message if isinstance(message, str) else json.dumps(message))
    return json.loads(await socket.receive_from(timeout=10))


def metrics(seq: int, step: int = 1, **values: float) -> dict:
    values = values or {"rollout/success_rate": 0.5}
    return {"v": 1, "type": "metrics", "seq": seq, "step": step, "time": 1.7e9, "values": values}


def event(seq: int, kind: str, **data) -> dict:
    return {"v": 1, "type": "event", "seq": seq, "kind": kind, "data": data}


@database_sync_to_async
def reload(run: Run) -> Run:
    return Run.objects.get(pk=run.pk)


@database_sync_to_async
def rows(model, run: Run, *fields: str) -> list:
    # Metric points belong to their run through their key row.
    owner = {"key__run": run} if model is MetricPoint else {"run": run}
    return list(model.objects.filter(**owner).order_by("pk").values_list(*fields))


@pytest.mark.parametrize("token", [None, "", "not-a-token"])
async def test_it_refuses_a_missing_or_forged_token(run, token):
    ok, code = await link(run.pk, token).connect()
    assert (ok, code) == (False, CLOSE_UNAUTHENTICATED)


async def test_it_refuses_the_token_of_another_run(run):
    other = await database_sync_to_async(make_run)()
    ok, code = await link(run.pk, make_run_token(other.pk)).connect()
    assert (ok, code) == (False, CLOSE_FORBIDDEN)


async def test_it_refuses_a_finished_run():
    cancelled = await database_sync_to_async(make_run)(RunState.CANCELLED)
    ok, code = await link(cancelled.pk, make_run_token(cancelled.pk)).connect()
    assert (ok, code) == (False, CLOSE_FORBIDDEN)


async def test_a_cancelled_runs_trainer_reports_until_its_job_has_ended():
    """Its checkpoint and `stopped` report are on their way out of the job."""
    run = await database_sync_to_async(make_run)(RunState.RUNNING)
    await database_sync_to_async(transition)(run.pk, RunState.CANCELLED, job_ended=False)
    socket = await connected(run)
    stopped = event(1, "stopped", iteration=3, total=9, signal="SIGTERM")
    assert (await exchange(socket, stopped))["type"] == "ack"
    await socket.disconnect()
    assert await database_sync_to_async(run.events.filter(kind="stopped").exists)()

    await database_sync_to_async(Run.objects.filter(pk=run.pk).update)(job_ended=True)
    ok, code = await link(run.pk, make_run_token(run.pk)).connect()
    assert (ok, code) == (False, CLOSE_FORBIDDEN)


async def test_it_refuses_an_unknown_run():
    ok, code = await link(987654, make_run_token(987654)).connect()
    assert (ok, code) == (False, CLOSE_NOT_FOUND)


async def test_browsers_still_need_an_allowed_origin():
    socket = WebsocketCommunicator(websocket_application, "/ws/status/")  # no Origin
    ok, _ = await socket.connect()
    assert not ok


async def test_metrics_are_stored_then_acknowledged_then_broadcast(run):
    layer = get_channel_layer()
    browser = await layer.new_channel()
    await layer.group_add(run_group(run.pk), browser)
    socket = await connected(run)
    reply = await exchange(socket, metrics(1, step=3, **{"a/x": 1.5, "a/y": 2}))
    assert reply == {"type": "ack", "seq": 1}
    assert await rows(MetricPoint, run, "key__name", "step", "value", "wall_time") == [
        ("a/x", 3, 1.5, 1.7e9),
        ("a/y", 3, 2.0, 1.7e9),
    ]
    pushed = await layer.receive(browser)
    assert pushed == {
        "type": "run.metrics", "run": run.pk, "seq": 1, "step": 3, "time": 1.7e9,
        "values": {"a/x": 1.5, "a/y": 2},
    }  # fmt: skip
    await socket.disconnect()


async def test_a_resent_message_is_acknowledged_but_stored_once(run):
    socket = await connected(run)
    assert await exchange(socket, metrics(1)) == {"type": "ack", "seq": 1}
    assert await exchange(socket, metrics(1)) == {"type": "ack", "seq": 1}
    await socket.disconnect()
    again = await connected(run)  # as after a reconnect
    assert await exchange(again, metrics(1)) == {"type": "ack", "seq": 1}
    assert await exchange(again, metrics(2, step=2)) == {"type": "ack", "seq": 2}
    assert await rows(TelemetryBatch, run, "seq") == [(1,), (2,)]
    assert await rows(MetricPoint, run, "step") == [(1,), (2,)]
    await again.disconnect()


NAN_VALUES = '{"v": 1, "type": "metrics", "seq": 5, "step": 1, "time": 1, "values": {"a": NaN}}'
INFINITE_TIME = (
    '{"v": 1, "type": "metrics", "seq": 5, "step": 1, "time": 1e999, "values": {"a": 1}}'
)
MARKUP_KEY = "counts/task<img src=x onerror=alert(document.cookie)>/episodes"


def takeover(**changes) -> dict:
    data = {"operator": "olga", "robot": 0, "robot_name": "sim-0", "started": 1.7e9,
            "ended": 1.7e9 + 5, "steps": 40, "reason": "released", **changes}  # fmt: skip
    return event(5, "takeover", **data)


def nested(depth: int) -> dict:
    data: dict = {}
    for _ in range(depth):
        data = {"a": data}
    return data


@pytest.mark.parametrize(
    ("message", "seq", "error"),
    [
        ("{not json", None, "not JSON"),
        ("[1, 2]", None, "must be a JSON object"),
        ({**metrics(1), "seq": 0}, None, "seq: Input should be greater than or equal to 1"),
        ({**metrics(1), "seq": "7"}, None, "seq: Input should be a valid integer"),
        ({**metrics(1), "seq": True}, None, "seq: Input should be a valid integer"),
        ({**metrics(5), "v": 2}, 5, "v: Input should be 1"),
        ({**metrics(5), "type": "gossip"}, 5, "Input tag 'gossip' found using 'type'"),
        ({**metrics(5), "extra": 1}, 5, "extra: Extra inputs are not permitted"),
        ({"v": 1, "type": "metrics", "seq": 5}, 5,
         "step: Field required; time: Field required; values: Field required"),
        ({**metrics(5), "step": -1}, 5, "step: Input should be greater than or equal to 0"),
        ({**metrics(5), "step": 1.5}, 5, "step: Input should be a valid integer"),
        ({**metrics(5), "values": {}}, 5, "values: Dictionary should have at least 1 item"),
        ({**metrics(5), "values": {"a": "high"}}, 5, "values.a: Input should be a valid number"),
        (NAN_VALUES, 5, "values.a: Input should be a finite number"),
        (INFINITE_TIME, 5, "time: Input should be a finite number"),
        (metrics(5, **{f"k{i}": 1.0 for i in range(1001)}), 5,
         "values: Dictionary should have at most 1000 items"),
        (metrics(5, **{"k" * 201: 1.0}), 5, METRIC_KEY_RULE),
        # Metric keys: a safe set only (no markup, spaces or brackets), named in the error.
        (metrics(5, **{MARKUP_KEY: 1.0}), 5,
         f"values.'counts/task<img src=x onerror='.[key]: {METRIC_KEY_RULE}"),
        (metrics(5, **{"success rate": 1.0}), 5, METRIC_KEY_RULE),
        (metrics(5, **{"": 1.0}), 5, METRIC_KEY_RULE),
        (event(5, "finished", summary={"a[0]": 1.0}), 5,
         f"data.summary.'a[0]'.[key]: {METRIC_KEY_RULE}"),
        # Text PostgreSQL cannot store, anywhere: keys, data at any depth, names.
        (metrics(5, **{"loss\x00x": 1.0}), 5,
         "values.'loss\\x00x'.[key]: a string holds a NUL character (U+0000 at character 5)"),
        (metrics(5, **{"\udcff": 1.0}), 5, "an unpaired surrogate (U+DCFF at character 1)"),
        (event(5, "checkpoint", path="/x/\x00.pt"), 5, "data.path: a string holds a NUL"),
        (event(5, "failed", error="x", notes=[{"deep": ["ok", "\udcff"]}]), 5,
         "data.notes.0.deep.1: a string holds an unpaired surrogate"),
        (event(5, "started", **{"na\udcffme": 1}), 5,
         "data.'na\\udcffme'.[key]: a string holds an unpaired"),
        (takeover(operator="ol\x00ga"), 5, "data.operator: a string holds a NUL"),
        # Numbers within what stores and renders them.
        (metrics(5) | {"time": MAX_WALL_TIME + 1}, 5, "time: Input should be less than or equal"),
        (metrics(5) | {"time": -1}, 5, "time: Input should be greater than or equal to 0"),
        (takeover(started=1e18), 5, "data.started: Input should be less than or equal to 2534023"),
        (takeover(ended="soon"), 5, "data.ended: Input should be a valid number"),
        (takeover(ended=1.7e9 - 1), 5, "data: ended must not be before started"),
        (event(5, "checkpoint", iteration=2**63), 5, "data.iteration: integers must lie within"),
        (event(5, "started", **nested(70)), 5, "nests deeper than 64 levels"),
        # Too long to parse: the seq is read from where the trainer writes it.
        ('{"v":1,"seq":5,' + " " * 2**18 + "}", 5, "message longer than 262144 characters"),
        ({"v": 1, "type": "progress", "seq": 5, "step": 4, "total": 3}, 5, "step must not exceed"),
        (event(5, "lunch"), 5, "kind: Input should be 'started'"),
        ({**event(5, "checkpoint"), "data": []}, 5, "data: Input should be a valid dictionary"),
        (event(5, "finished"), 5, "a finished event needs data.summary"),
        (event(5, "iteration", loss=float("inf")), 5, "finite numbers"),
    ],
)  # fmt: skip
async def test_a_bad_message_gets_an_error_and_the_link_stays_open(run, message, seq, error):
    socket = await connected(run)
    if isinstance(message, dict):
        message = json.dumps(message)  # json.dumps writes inf as Infinity, as a bad sender would
    reply = await exchange(socket, message)
    assert reply["type"] == "error" and reply["seq"] == seq
    assert error in reply["error"]
    assert await exchange(socket, metrics(9)) == {"type": "ack", "seq": 9}
    assert await rows(TelemetryBatch, run, "seq") == [(9,)]
    assert (await reload(run)).link_rejected == 1  # counted, shown on the run page
    await socket.disconnect()


async def test_a_binary_frame_gets_an_error(run):
    socket = await connected(run)
    await socket.send_to(bytes_data=b"\x00")
    assert json.loads(await socket.receive_from(timeout=10))["error"] == "send text frames"
    await socket.disconnect()


async def test_started_moves_a_submitting_run_to_running(run):
    socket = await connected(run)
    assert await exchange(socket, event(1, "started", name="x")) == {"type": "ack", "seq": 1}
    assert (await reload(run)).state == RunState.RUNNING
    # A second start (say, a resumed trainer) is stored and acknowledged; the state stays.
    assert await exchange(socket, event(2, "started")) == {"type": "ack", "seq": 2}
    assert (await reload(run)).state == RunState.RUNNING
    kinds = [kind for (kind,) in await rows(RunEvent, run, "kind")]
    assert kinds == ["state", "started", "state", "started"]
    await socket.disconnect()


async def test_progress_updates_the_run_and_the_runs_list(run):
    layer = get_channel_layer()
    runs_list = await layer.new_channel()
    await layer.group_add(RUNS_LIST, runs_list)
    socket = await connected(run)
    progress = {"v": 1, "type": "progress", "seq": 1, "step": 2, "total": 60}
    assert await exchange(socket, progress) == {"type": "ack", "seq": 1}
    stored = await reload(run)
    assert (stored.progress_step, stored.progress_total) == (2, 60)
    pushed = await layer.receive(runs_list)
    assert pushed == {"type": "run.progress", "run": run.pk, "seq": 1, "step": 2, "total": 60}
    await socket.disconnect()


async def test_finished_stores_the_summary_and_ends_the_run_at_once():
    running = await database_sync_to_async(make_run)(RunState.RUNNING)
    socket = await connected(running)
    summary = {"rollout/success_rate": 0.875, "losses/value_loss": 0.01}
    message = event(1, "finished", iteration=60, total=60, summary=summary)
    assert await exchange(socket, message) == {"type": "ack", "seq": 1}
    stored = await reload(running)
    assert stored.summary == summary
    assert stored.state == RunState.SUCCEEDED and stored.exit_reason == "the trainer finished"
    await socket.disconnect()


async def test_failed_and_checkpoint_events_join_the_timeline_and_fail_the_run(run):
    socket = await connected(run)
    await exchange(socket, event(1, "checkpoint", iteration=20, path="/x/iter_000020.pt"))
    await exchange(socket, event(2, "failed", error="RuntimeError: boom", traceback="..."))
    timeline = await rows(RunEvent, run, "kind", "message")
    assert ("checkpoint", "") in timeline and ("failed", "RuntimeError: boom") in timeline
    stored = await reload(run)
    assert stored.state == RunState.FAILED and stored.exit_reason == "RuntimeError: boom"
    await socket.disconnect()


async def test_a_cancelled_trainer_dying_does_not_turn_the_cancel_into_a_failure(run):
    await database_sync_to_async(Run.objects.filter(pk=run.pk).update)(
        cancel_requested_at=run.created_at
    )
    socket = await connected(run)
    await exchange(socket, event(1, "failed", error="KeyboardInterrupt"))
    assert (await reload(run)).state == RunState.SUBMITTING  # the cancel decides
    await socket.disconnect()


async def test_progress_only_moves_forward(run):
    socket = await connected(run)
    for seq, step in enumerate([3, 5, 4, 2], start=1):
        await exchange(socket, {"v": 1, "type": "progress", "seq": seq, "step": step, "total": 9})
    assert (await reload(run)).progress_step == 5
    await socket.disconnect()


async def test_a_resumed_run_stores_its_new_attempts_seqs_and_refuses_the_old_token(run):
    old = await connected(run)
    await exchange(old, event(1, "checkpoint", iteration=1, path="a"))
    await old.disconnect()
    await database_sync_to_async(Run.objects.filter(pk=run.pk).update)(attempt=2)
    ok, code = await link(run.pk, make_run_token(run.pk, 1)).connect()
    assert not ok and code == CLOSE_FORBIDDEN
    new = link(run.pk, make_run_token(run.pk, 2))
    assert (await new.connect())[0]
    assert await exchange(new, event(1, "checkpoint", iteration=2, path="b")) == {
        "type": "ack", "seq": 1,
    }  # fmt: skip
    stored = await rows(TelemetryBatch, run, "attempt", "seq")
    assert sorted(stored) == [(1, 1), (2, 1)]
    await new.disconnect()


def test_messages_stored_together_are_broadcast_as_one_batch_in_order(run):
    from controlplane.runs import telemetry

    messages = [
        {"type": "metrics", "seq": 1, "step": 1, "time": 1.0, "values": {"a": 1.0}},
        {"type": "progress", "seq": 2, "step": 1, "total": 9},
        {"type": "progress", "seq": 3, "step": 2, "total": 9},
    ]
    assert telemetry.record_many(run.pk, messages) == [True, True, True]
    assert telemetry.record_many(run.pk, messages[1:]) == [False, False]  # resent
    out = dict(telemetry.broadcast_batches(run.pk, messages))
    batch = out[run_group(run.pk)]
    assert batch["type"] == "run.batch"
    assert [(e["type"], e["seq"]) for e in batch["events"]] == [
        ("run.metrics", 1), ("run.progress", 2), ("run.progress", 3)
    ]  # fmt: skip
    assert out[RUNS_LIST]["seq"] == 3  # the list redraws its row: the last is enough
    lone = telemetry.broadcast_batches(run.pk, messages[:1])
    assert lone == [(run_group(run.pk), batch["events"][0])]


def test_a_resent_batch_is_stored_once_on_either_write_path(run):
    """Metrics-only batches are one statement on PostgreSQL, a transaction elsewhere:
    either way a resent seq is refused and its points are not stored twice."""
    from controlplane.runs import telemetry

    def metrics(seq: int) -> dict:
        return {"type": "metrics", "seq": seq, "step": seq, "time": 1.0,
                "values": {"a/x": float(seq), "a/y": 0.5}}  # fmt: skip

    known: dict[str, int] = {}
    assert telemetry.record_many(run.pk, [metrics(1), metrics(2)], known_keys=known) == [
        True, True
    ]  # fmt: skip
    again = telemetry.record_many(run.pk, [metrics(2), metrics(3)], known_keys=known)
    assert again == [False, True]
    stored = MetricPoint.objects.filter(key__run=run).order_by("step", "key__name")
    assert list(stored.values_list("key__name", "step", "value")) == [
        ("a/x", 1, 1.0), ("a/y", 1, 0.5), ("a/x", 2, 2.0), ("a/y", 2, 0.5),
        ("a/x", 3, 3.0), ("a/y", 3, 0.5),
    ]  # fmt: skip
    assert telemetry.record_many(run.pk, [{**metrics(4), "values": {}}]) == [True]
