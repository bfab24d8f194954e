"""A run page's socket sends a fragment only when it changed, and keeps every card that
can change live: a checkpoint brings the Files card and the Evaluate form, an eval run's
state change brings the Evaluations card of the run it evaluates."""

import json
import re

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.realtime import publish
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
    return submitted_run("cards")


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_user("otto", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client.force_login(user)
    return user, f"sessionid={client.cookies['sessionid'].value}"


async def browser(run: Run, cookie: str) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(
        websocket_application, f"/ws/runs/{run.pk}/",
        headers=[(b"origin", b"http://localhost"), (b"cookie", cookie.encode())],
    )  # fmt: skip
    connected, code = await socket.connect()
    assert connected, code
    first = await socket.receive_from(timeout=10)  # everything, once
    parts = (
        "run-header",
        "run-events",
        "run-processes",
        "run-model",
        "run-files",
        "run-evaluations",
    )
    for part in parts:
        assert f'id="{part}"' in first, part
    return socket


def write_checkpoint(run: Run, iteration: int) -> str:
    folder = artifacts.run_artifact_dir(run.pk) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"iter_{iteration}.pt"
    path.write_bytes(b"weights")
    return str(path)


async def test_only_the_fragments_that_changed_are_sent(run, operator):
    page = await browser(run, operator[1])
    link = await trainer(run)
    await send(link, {"type": "progress", "seq": 1, "step": 3, "total": 10})
    assert json.loads(await page.receive_from(timeout=10))["type"] == "progress"
    header = await page.receive_from(timeout=10)
    assert header.startswith('<div id="run-header"') and 'data-step="3"' in header
    # A progress that moves nothing (the bar only goes forward): no fragment at all.
    await send(link, {"type": "progress", "seq": 2, "step": 2, "total": 10})
    assert json.loads(await page.receive_from(timeout=10))["type"] == "progress"
    assert await page.receive_nothing(timeout=0.5)
    # An event: the events list changes, the files and evaluations cards do not.
    await send(link, {"type": "event", "seq": 3, "kind": "recovered", "data": {"what": "x"}})
    fragments = await page.receive_from(timeout=10)
    assert 'id="run-events"' in fragments and 'data-kind="recovered"' in fragments
    assert 'id="run-files"' not in fragments and 'id="run-evaluations"' not in fragments
    assert 'id="run-header"' not in fragments
    await link.disconnect()
    await page.disconnect()


async def test_the_pages_own_socket_leaves_what_it_shows_alone(run, operator, client):
    """The page tells its socket what it was rendered with: nothing is swapped at
    connect unless it changed since, so no control is replaced under a user's click."""
    html = (await database_sync_to_async(client.get)(f"/runs/{run.pk}/")).content.decode()
    url = html[html.index('ws-connect="') + len('ws-connect="') :].split('"')[0]
    assert url.startswith(f"/ws/runs/{run.pk}/?seen=run-header")
    page = WebsocketCommunicator(
        websocket_application, url.replace("&amp;", "&"),
        headers=[(b"origin", b"http://localhost"), (b"cookie", operator[1].encode())],
    )  # fmt: skip
    connected, code = await page.connect()
    assert connected, code
    assert await page.receive_nothing(timeout=1)
    await database_sync_to_async(write_checkpoint)(run, 4)
    link = await trainer(run)
    await send(link, {"type": "event", "seq": 1, "kind": "checkpoint",
                      "data": {"iteration": 4, "path": "checkpoints/iter_4.pt"}})  # fmt: skip
    fragments = await page.receive_from(timeout=10)
    assert 'id="run-files"' in fragments and 'id="run-evaluations"' in fragments
    assert 'id="run-header"' not in fragments and 'id="run-processes"' not in fragments
    await link.disconnect()
    await page.disconnect()


def test_the_page_holds_its_live_parts_as_plain_content(run, operator, client):
    """htmx's ws extension swaps each element of a socket message by its id, so the page's
    own copies need no hx-swap-oob: with one, an htmx response that holds the page (a
    boosted link to it, the page Stop's redirect leads to) would swap them into the page
    it lands on, and take them out of the page itself."""
    html = client.get(f"/runs/{run.pk}/").content.decode()
    for part in ("run-header", "run-events", "run-processes", "run-model", "run-files"):
        assert f'id="{part}"' in html, part
    assert "hx-swap-oob" not in html


async def test_a_checkpoint_brings_its_file_and_the_evaluate_form(run, operator):
    page = await browser(run, operator[1])
    link = await trainer(run)
    path = write_checkpoint(run, 4)
    await send(link, {"type": "event", "seq": 1, "kind": "checkpoint",
                      "data": {"iteration": 4, "path": path}})  # fmt: skip
    fragments = await page.receive_from(timeout=10)
    files = fragments[fragments.index('<section class="card" id="run-files"') :]
    assert "checkpoints/iter_4.pt" in files.split("</section>")[0]
    evaluations = fragments[fragments.index('<section class="card" id="run-evaluations"') :]
    form = evaluations.split("</section>")[0]
    assert 'id="evaluate-form"' in form and '<option value="4"' in form
    await link.disconnect()
    await page.disconnect()


async def test_an_eval_runs_state_reaches_the_page_of_the_run_it_evaluates(
    run, operator, monkeypatch
):
    monkeypatch.setattr(publish, "_in_web_process", True)  # this process holds the layer
    user, cookie = operator
    write_checkpoint(run, 4)
    page = await browser(run, cookie)
    evaluation, _ = await database_sync_to_async(request_evaluation)(
        run, EvalRequest(checkpoint=4), user=user
    )
    await database_sync_to_async(transition)(evaluation.pk, RunState.SUBMITTING)
    fragments = await page.receive_from(timeout=10)
    assert f'<tr data-run="{evaluation.pk}" data-state="submitting">' in fragments
    await page.disconnect()


async def test_the_trainers_model_card_arrives_live_and_shows_as_text(run, operator):
    page = await browser(run, operator[1])
    link = await trainer(run)
    card = {
        "kind": "vla", "family": "paligemma", "parameters": 2_923_456,
        "trainable_parameters": 81_920,
        "lora": {"rank": 16, "alpha": 32.0, "dropout": 0.0, "target_modules": ["q_proj"]},
        "freeze_vision": True, "gradient_checkpointing": False, "action_bins": 256,
        "image_size": [224, 224], "unknown_key": "<b>not shown</b>",
        "base": {"path": "/models/<script>alert(1)</script>", "sha256": "ab" * 32},
    }  # fmt: skip
    await send(link, {"type": "event", "seq": 1, "kind": "model", "data": card})
    fragments = await page.receive_from(timeout=10)
    shown = fragments[fragments.index('<div id="run-model"') :].split("</div>")[0]
    rows = dict(re.findall(r'<th scope="row">([^<]+)</th><td>(.+?)</td>', shown))
    assert rows["Family"] == "paligemma" and rows["Parameters"] == "2,923,456"
    assert rows["Trainable parameters"] == "81,920" and rows["Vision tower frozen"] == "yes"
    assert rows["LoRA"] == "rank 16, alpha 32.0, dropout 0.0, target_modules q_proj"
    assert rows["Image size"] == "224 × 224" and rows["Action bins per dim"] == "256"
    assert "&lt;script&gt;" in rows["Base folder"] and "<script>" not in shown
    assert "not shown" not in shown and rows["Base SHA-256"].startswith('<code title="abab')
    await link.disconnect()
    await page.disconnect()
