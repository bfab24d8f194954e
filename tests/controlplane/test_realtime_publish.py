"""Realtime messages published by other processes reach the browsers' sockets, in both
channel-layer modes (Redis; in-memory with the HTTP relay)."""

import os
import subprocess
import sys
import time

import pytest
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.core import signing
from websockets.sync.client import connect

from controlplane.realtime import publish as publish_module
from controlplane.realtime.groups import SYSTEM_STATUS
from controlplane.realtime.nonces import NonceRegister
from controlplane.realtime.publish import (
    RELAY_MAX_AGE_S,
    RELAY_PATH,
    RELAY_SALT,
    publish,
    relay_is_served,
    sign_relay_payload,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.embedded]
# The relay is mounted only with the in-memory layer; the suite also runs with Redis.
one_machine_only = pytest.mark.skipif(
    not relay_is_served(), reason="the relay is mounted only in the one-machine mode"
)


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


@one_machine_only
def test_the_relay_refuses_a_forged_signature(client):
    body = signing.dumps({"group": SYSTEM_STATUS, "message": {"type": "x"}}, key="not-our-key")
    response = client.post(RELAY_PATH, body, content_type="text/plain")
    assert response.status_code == 403
    assert response.json() == {"error": "bad or expired signature"}


@one_machine_only
def test_the_relay_names_a_malformed_message(client):
    response = client.post(
        RELAY_PATH, sign_relay_payload(SYSTEM_STATUS, {"no": "type"}), content_type="text/plain"
    )
    assert response.status_code == 400
    assert "string 'type'" in response.json()["error"]


@one_machine_only
def test_the_relay_names_an_invalid_group(client):
    response = client.post(
        RELAY_PATH, sign_relay_payload("bad group!", {"type": "x"}), content_type="text/plain"
    )
    assert response.status_code == 400
    assert "group name" in response.json()["error"].lower()


@one_machine_only
def test_the_relay_accepts_only_post(client):
    assert client.get(RELAY_PATH).status_code == 405


class OldTimestampSigner(signing.TimestampSigner):
    """Signs as if it were RELAY_MAX_AGE_S + 1 seconds ago."""

    def timestamp(self) -> str:
        return signing.b62_encode(int(time.time()) - RELAY_MAX_AGE_S - 1)


@one_machine_only
def test_a_captured_message_cannot_be_replayed(client):
    body = sign_relay_payload(SYSTEM_STATUS, {"type": "status.refresh"})
    assert client.post(RELAY_PATH, body, content_type="text/plain").status_code == 200
    replayed = client.post(RELAY_PATH, body, content_type="text/plain")
    assert replayed.status_code == 403
    assert replayed.json() == {"error": "message already delivered: each is accepted once"}
    # A new message (a new nonce) with the same content goes through.
    again = sign_relay_payload(SYSTEM_STATUS, {"type": "status.refresh"})
    assert client.post(RELAY_PATH, again, content_type="text/plain").status_code == 200


@one_machine_only
def test_a_message_past_the_time_window_or_without_a_nonce_is_refused(client):
    payload = {"group": SYSTEM_STATUS, "message": {"type": "x"}, "nonce": "n" * 22}
    stale = OldTimestampSigner(salt=RELAY_SALT).sign_object(payload)
    response = client.post(RELAY_PATH, stale, content_type="text/plain")
    assert response.status_code == 403
    assert response.json() == {"error": "bad or expired signature"}

    no_nonce = signing.dumps({"group": SYSTEM_STATUS, "message": {"type": "x"}}, salt=RELAY_SALT)
    response = client.post(RELAY_PATH, no_nonce, content_type="text/plain")
    assert response.status_code == 400
    assert "nonce" in response.json()["error"]


def test_the_nonce_register_forgets_what_is_past_its_window():
    remembered = NonceRegister(remember_s=3600)
    assert remembered.first_use("a" * 22) and not remembered.first_use("a" * 22)
    forgotten = NonceRegister(remember_s=0)  # every nonce is past its window at once
    assert forgotten.first_use("a" * 22) and forgotten.first_use("a" * 22)
    assert len(forgotten) == 1  # expired entries are dropped: memory stays bounded


RELAY_UNDER_REDIS = """
from django.test import Client
from django.urls import NoReverseMatch, reverse
from controlplane.realtime.publish import RELAY_PATH, sign_relay_payload
try:
    reverse("realtime-relay")
    print("mounted")
except NoReverseMatch:
    print("not mounted")
body = sign_relay_payload("system.status", {"type": "status.refresh"})
print(Client(HTTP_HOST="localhost").post(RELAY_PATH, body, content_type="text/plain").status_code)
"""


def test_with_redis_the_relay_is_not_mounted_and_answers_404(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "ARMATURE_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="controlplane.settings",
        ARMATURE_VAR_DIR=str(tmp_path),
        # Settings only: resolving a URL connects to nothing.
        REDIS_URL=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"),
    )
    result = subprocess.run(
        [sys.executable, "-c", "import django; django.setup()\n" + RELAY_UNDER_REDIS],
        cwd=django_settings.BASE_DIR, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["not", "mounted", "404"]
