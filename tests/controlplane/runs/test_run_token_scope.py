"""A run token opens one thing: its own run's trainer link, while the run is not final.
When the run ends, the server closes the links still open with it."""

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from rest_framework.test import APIClient
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from controlplane.realtime import publish as publish_module
from controlplane.realtime.routing import websocket_application
from controlplane.realtime.trainer_consumer import CLOSE_FORBIDDEN, CLOSE_RUN_FINISHED
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.link.client import TrainerLink

pytestmark = pytest.mark.django_db(transaction=True)


def make_run() -> Run:
    return submitted_run(f"scope-{Run.objects.count()}")


@pytest.fixture
def run() -> Run:
    return make_run()


@pytest.fixture
def in_web_process(monkeypatch):
    """The communicator runs the consumers in this process, so this process is the web
    server whose in-memory layer they listen on."""
    monkeypatch.setattr(publish_module, "_in_web_process", True)


def link(run_id: int, token: str) -> WebsocketCommunicator:
    headers = [(b"authorization", f"Bearer {token}".encode())]
    return WebsocketCommunicator(websocket_application, f"/ws/trainer/{run_id}/", headers=headers)


@pytest.mark.parametrize("final", [RunState.CANCELLED, RunState.FAILED, RunState.SUCCEEDED])
async def test_the_server_closes_the_link_when_the_run_ends(run, in_web_process, final):
    socket = link(run.pk, make_run_token(run.pk))
    assert (await socket.connect())[0]
    await database_sync_to_async(transition)(run.pk, final, "stopped by a test")
    closed = await socket.receive_output(timeout=10)
    assert closed == {"type": "websocket.close", "code": CLOSE_RUN_FINISHED}
    again = link(run.pk, make_run_token(run.pk))
    assert await again.connect() == (False, CLOSE_FORBIDDEN)  # the token is spent


async def test_a_link_stays_open_while_the_run_goes_on(run, in_web_process):
    socket = link(run.pk, make_run_token(run.pk))
    assert (await socket.connect())[0]
    await database_sync_to_async(transition)(run.pk, RunState.RUNNING)
    assert await socket.receive_nothing(timeout=0.5)
    await socket.disconnect()


async def test_ending_one_run_leaves_another_runs_link_open(run, in_web_process):
    other = await database_sync_to_async(make_run)()
    socket = link(other.pk, make_run_token(other.pk))
    assert (await socket.connect())[0]
    await database_sync_to_async(transition)(run.pk, RunState.CANCELLED)
    assert await socket.receive_nothing(timeout=0.5)
    await socket.disconnect()


async def test_a_token_opens_only_its_own_runs_link(run):
    other = await database_sync_to_async(make_run)()
    assert await link(other.pk, make_run_token(run.pk)).connect() == (False, CLOSE_FORBIDDEN)


def test_a_run_token_is_no_api_credential(run):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Bearer {make_run_token(run.pk)}")
    for path in ("/api/v1/runs", f"/api/v1/runs/{run.pk}", "/api/v1/schema/"):
        response = api.get(path)
        assert response.status_code == 401, path
        assert b"Malformed API token" in response.content


def test_a_live_server_closes_a_trainers_link_from_another_process(stack_factory, settings, run):
    """The run ends in this process (as in a Celery worker): the message travels to the
    web server through the channel layer or, in the one-machine mode, the relay."""
    web = stack_factory()
    web.start_web()
    settings.ARMATURE_WEB_URL = web.url
    url = web.url.replace("http", "ws") + f"/ws/trainer/{run.pk}/"
    headers = {"Authorization": f"Bearer {make_run_token(run.pk)}"}
    with connect(url, additional_headers=headers, open_timeout=10) as socket:
        transition(run.pk, RunState.CANCELLED, "cancelled by a test")
        with pytest.raises(ConnectionClosed) as closed:
            socket.recv(timeout=15)
    assert closed.value.rcvd.code == CLOSE_RUN_FINISHED


def test_the_trainers_client_gives_up_when_its_run_ends(stack_factory, settings, run):
    web = stack_factory()
    web.start_web()
    settings.ARMATURE_WEB_URL = web.url
    trainer = TrainerLink(web.url, run.pk, make_run_token(run.pk))
    try:
        trainer.progress(1, 10)
        wait_until(lambda: trainer.pending() == 0, 20, "the first message acknowledged")
        transition(run.pk, RunState.CANCELLED, "cancelled by a test")
        wait_until(lambda: trainer.refused is not None, 20, "the link refused for good")
        assert trainer.refused == "the run has ended"  # what CLOSE_RUN_FINISHED means to it
    finally:
        trainer.close(timeout=5)
