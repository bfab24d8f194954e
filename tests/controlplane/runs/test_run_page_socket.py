"""A run page's socket, through the real ASGI application: what a trainer reports reaches
the browser as JSON frames for the charts, and as htmx fragments for the header
(with the controls the state allows) and the events list. An eval run's page has no
charts: its socket sends fragments only."""

import json

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.realtime.routing import websocket_application
from controlplane.runs import artifacts
from controlplane.runs.evaluations import EvalRequest, request_evaluation
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from tests.runs import submitted_run
from tests.trainer_socket import send, trainer

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def run() -> Run:
    return submitted_run("socket")


@pytest.fixture
def operator_cookie(client) -> str:
    user = get_user_model().objects.create_user("otto", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def eval_run(run, operator_cookie) -> Run:
    """A submitted eval run of `run`'s checkpoint of iteration 4."""
    folder = artifacts.run_artifact_dir(run.pk) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "iter_4.pt").write_bytes(b"weights")
    user = get_user_model().objects.get(username="otto")
    evaluation, _ = request_evaluation(run, EvalRequest(checkpoint=4), user=user)
    transition(evaluation.pk, RunState.SUBMITTING)
    evaluation.refresh_from_db()
    return evaluation


async def browser(run: Run, cookie: str) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(
        websocket_application, f"/ws/runs/{run.pk}/",
        headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())],
    )  # fmt: skip
    connected, code = await socket.connect()
    assert connected, code
    first = await socket.receive_from(timeout=10)  # what changed since the page load
    assert 'id="run-header"' in first and 'id="run-events"' in first
    return socket


async def test_metrics_and_progress_reach_the_page_as_json(run, operator_cookie):
    page = await browser(run, operator_cookie)
    link = await trainer(run)
    values = {"rollout/success_rate": 0.25, "rollout/plan_success_rate_h5": 0.5}
    await send(link, {"type": "metrics", "seq": 1, "step": 1, "time": 1.7e9, "values": values})
    assert json.loads(await page.receive_from(timeout=10)) == {
        "type": "metrics", "run": run.pk, "seq": 1, "step": 1, "time": 1.7e9, "values": values,
    }  # fmt: skip
    await send(link, {"type": "progress", "seq": 2, "step": 1, "total": 10})
    frame = json.loads(await page.receive_from(timeout=10))
    assert frame == {"type": "progress", "run": run.pk, "seq": 2, "step": 1, "total": 10}
    header = await page.receive_from(timeout=10)
    assert 'data-step="1"' in header and 'data-total="10"' in header
    await link.disconnect()
    await page.disconnect()


async def test_events_and_controls_follow_the_state(run, operator_cookie):
    page = await browser(run, operator_cookie)
    link = await trainer(run)
    await send(link, {"type": "event", "seq": 1, "kind": "started", "data": {}})
    fragments = ""
    while 'data-kind="started"' not in fragments or 'data-state="running"' not in fragments:
        fragments += await page.receive_from(timeout=10)
    assert "Stop</button>" in fragments  # an active run can be stopped…
    await send(link, {"type": "event", "seq": 2, "kind": "finished", "data": {"summary": {}}})
    fragments = ""
    while 'data-state="succeeded"' not in fragments:
        fragments += await page.receive_from(timeout=10)
    header = fragments[fragments.rindex('<div id="run-header"') :]
    assert "Stop</button>" not in header  # …a finished one cannot
    assert (await database_sync_to_async(Run.objects.get)(pk=run.pk)).state == "succeeded"
    await page.disconnect()


async def test_a_burst_stored_together_reaches_the_page_frame_by_frame_in_order(
    run, operator_cookie
):
    page = await browser(run, operator_cookie)
    link = await trainer(run)
    burst = [
        {"v": 1, "type": "metrics", "seq": seq, "step": seq, "time": 1.7e9 + seq,
         "values": {"charts/env_steps": float(seq)}}
        for seq in range(1, 41)
    ]  # fmt: skip
    for message in burst:  # all at once, as a trainer catching up does
        await link.send_to(text_data=json.dumps(message))
    acks = [json.loads(await link.receive_from(timeout=10))["seq"] for _ in burst]
    assert acks == list(range(1, 41))
    frames = [json.loads(await page.receive_from(timeout=10)) for _ in burst]
    assert [(f["type"], f["seq"], f["step"]) for f in frames] == [
        ("metrics", seq, seq) for seq in range(1, 41)
    ]
    await link.disconnect()
    await page.disconnect()


async def test_a_burst_of_progress_and_an_event_ends_on_the_header_they_made(run, operator_cookie):
    page = await browser(run, operator_cookie)
    link = await trainer(run)
    burst = [
        {"v": 1, "type": "progress", "seq": seq, "step": seq, "total": 40} for seq in (1, 2, 3)
    ]
    burst.append({"v": 1, "type": "event", "seq": 4, "kind": "started", "data": {}})
    for message in burst:
        await link.send_to(text_data=json.dumps(message))
    for _ in burst:
        await link.receive_from(timeout=10)
    frames, header, events = [], "", ""
    # The messages may be stored in one write or several (however they gather), so the
    # header may already show step 3 and the running state when the event's render
    # comes, which then sends the events list alone (a fragment is sent when it
    # changed): read until the page holds, fragment by fragment, all the burst made.
    while [f["step"] for f in frames] != [1, 2, 3] or not (
        'data-step="3"' in header and 'data-kind="started"' in events
    ):
        text = await page.receive_from(timeout=10)
        if text.startswith("{"):
            frames.append(json.loads(text))
            assert len(frames) <= 3, frames  # each frame once, in order
            continue
        if 'id="run-header"' in text:
            header = text[text.index('id="run-header"') :]
        if 'id="run-events"' in text:
            events = text[text.index('id="run-events"') :]
    assert 'data-state="running"' in header
    await link.disconnect()
    await page.disconnect()


async def test_an_eval_runs_page_gets_fragments_and_never_a_json_frame(eval_run, operator_cookie):
    page = await browser(eval_run, operator_cookie)
    link = await trainer(eval_run)
    values = {"eval/success_rate": 0.5}
    await send(link, {"type": "metrics", "seq": 1, "step": 1, "time": 1.7e9, "values": values})
    await send(link, {"type": "progress", "seq": 2, "step": 1, "total": 4})
    # A burst stored together takes the batch path.
    for seq in (3, 4):
        await link.send_to(text_data=json.dumps(
            {"v": 1, "type": "metrics", "seq": seq, "step": seq, "time": 1.7e9, "values": values}
        ))  # fmt: skip
        await link.receive_from(timeout=10)
    await send(link, {"type": "event", "seq": 5, "kind": "started", "data": {}})
    received = []
    while not any('data-state="running"' in text for text in received):
        received.append(await page.receive_from(timeout=10))
    while not await page.receive_nothing(timeout=0.5):  # whatever follows, too
        received.append(await page.receive_from(timeout=10))
    assert all(text.startswith("<") for text in received), received
    assert any('data-step="1"' in text for text in received)  # progress still shows
    await link.disconnect()
    await page.disconnect()
