"""Realtime messages published by other processes reach the browsers' sockets, in both
channel-layer modes (Redis; in-memory with the HTTP relay)."""

import pytest
from django.contrib.auth import get_user_model
from django.core import signing
from websockets.sync.client import connect

from controlplane.realtime import publish as publish_module
from controlplane.realtime.groups import SYSTEM_STATUS
from controlplane.realtime.publish import RELAY_PATH, publish, sign_relay_payload

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def session_cookie(client) -> str:
    user = get_user_model().objects.create_user("grace", password="pw-for-tests")
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}"


@pytest.fixture
def live_web(stack_factory, settings):
    # A long poll interval: any frame after the first comes from a published refresh.
    stack = stack_factory(ARMATURE_STATUS_INTERVAL_S="600")
    stack.start_web()
    settings.ARMATURE_WEB_URL = stack.url
    return stack


def open_status_socket(stack, cookie: str):
    return connect(
        stack.url.replace("http", "ws") + "/ws/status/",
        additional_headers={"Cookie": cookie},
        origin=stack.url,
        open_timeout=10,
    )


def test_this_process_is_not_the_web_process():
    assert publish_module._in_web_process is False


def test_a_message_published_here_reaches_the_web_servers_sockets(live_web, session_cookie):
    with open_status_socket(live_web, session_cookie) as socket:
        assert 'id="status-panel"' in socket.recv(timeout=15)
        publish(SYSTEM_STATUS, {"type": "status.refresh"})
        assert 'id="status-panel"' in socket.recv(timeout=15)


def test_a_starting_celery_worker_pushes_a_refresh(live_web, session_cookie):
    with open_status_socket(live_web, session_cookie) as socket:
        first = socket.recv(timeout=15)
        assert 'data-component="worker" data-state="down"' in first
        live_web.start_worker()
        pushed = socket.recv(timeout=60)
        assert 'data-component="worker" data-state="up"' in pushed


def test_the_relay_refuses_a_forged_signature(client):
    body = signing.dumps({"group": SYSTEM_STATUS, "message": {"type": "x"}}, key="not-our-key")
    response = client.post(RELAY_PATH, body, content_type="text/plain")
    assert response.status_code == 403
    assert response.json() == {"error": "bad or expired signature"}


def test_the_relay_names_a_malformed_message(client):
    response = client.post(
        RELAY_PATH, sign_relay_payload(SYSTEM_STATUS, {"no": "type"}), content_type="text/plain"
    )
    assert response.status_code == 400
    assert "string 'type'" in response.json()["error"]


def test_the_relay_names_an_invalid_group(client):
    response = client.post(
        RELAY_PATH, sign_relay_payload("bad group!", {"type": "x"}), content_type="text/plain"
    )
    assert response.status_code == 400
    assert "group name" in response.json()["error"].lower()


def test_the_relay_accepts_only_post(client):
    assert client.get(RELAY_PATH).status_code == 405
