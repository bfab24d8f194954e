"""The live status panel over a WebSocket (Channels, in process)."""

import pytest
from channels.testing import WebsocketCommunicator
from django.contrib.auth import get_user_model

from controlplane.realtime.consumers import CLOSE_UNAUTHENTICATED
from controlplane.realtime.routing import websocket_application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.embedded]


def communicator(cookie: str = "") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://localhost")]
    if cookie:
        headers.append((b"cookie", cookie.encode()))
    return WebsocketCommunicator(websocket_application, "/ws/status/", headers=headers)


@pytest.fixture
def session_cookie(client) -> str:
    user = get_user_model().objects.create_user("ada", password="pw-for-tests")
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


async def test_it_refuses_anonymous_users():
    socket = communicator()
    connected, code = await socket.connect()
    assert not connected
    assert code == CLOSE_UNAUTHENTICATED


async def test_it_refuses_other_origins(session_cookie):
    socket = WebsocketCommunicator(
        websocket_application, "/ws/status/",
        headers=[(b"origin", b"http://evil.example"), (b"cookie", session_cookie.encode())],
    )  # fmt: skip
    connected, _ = await socket.connect()
    assert not connected


async def test_it_streams_the_status_panel_to_a_logged_in_user(session_cookie):
    socket = communicator(session_cookie)
    connected, _ = await socket.connect()
    assert connected
    html = await socket.receive_from(timeout=15)
    assert 'id="status-panel"' in html and 'hx-swap-oob="true"' in html
    for component in ("database", "broker", "worker", "channel_layer", "ray"):
        assert f'data-component="{component}"' in html
    assert 'data-component="database" data-state="up"' in html
    await socket.disconnect()


async def test_it_answers_a_message_with_a_clear_error(session_cookie):
    socket = communicator(session_cookie)
    await socket.connect()
    await socket.receive_from(timeout=15)  # the first panel
    await socket.send_to(text_data="{not json")
    reply = await socket.receive_from(timeout=15)
    assert 'id="status-error"' in reply
    assert "accepts no messages" in reply
    await socket.disconnect()
