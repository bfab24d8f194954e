"""Publishing realtime messages to browser groups from any process.

With a shared channel layer (Redis) every process sends to it directly. With the
in-memory layer of the one-machine mode only the web server's own layer reaches
the browsers, so other processes (the Celery worker, management commands) relay
their messages to the web server over HTTP, signed with the secret key.
"""

import json
import urllib.request

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.core import signing

RELAY_PATH = "/internal/realtime/publish"
RELAY_SALT = "armature.realtime.relay"
RELAY_MAX_AGE_S = 60
RELAY_TIMEOUT_S = 5

_in_web_process = False


def mark_web_process() -> None:
    """Called by the ASGI application: this process owns the browsers' channel layer."""
    global _in_web_process
    _in_web_process = True


def needs_relay() -> bool:
    return isinstance(get_channel_layer(), InMemoryChannelLayer) and not _in_web_process


async def publish_async(group: str, message: dict) -> None:
    """Send `message` (a channel-layer event with a "type") to every member of `group`."""
    await get_channel_layer().group_send(group, message)


def publish(group: str, message: dict) -> None:
    """Synchronous door for code outside the event loop (Celery tasks, services)."""
    if needs_relay():
        _relay(group, message)
    else:
        async_to_sync(publish_async)(group, message)


def sign_relay_payload(group: str, message: dict) -> bytes:
    return signing.dumps({"group": group, "message": message}, salt=RELAY_SALT).encode()


def unsign_relay_payload(body: bytes) -> tuple[str, dict]:
    """Return (group, message); raises signing.BadSignature on a forged or stale body."""
    data = signing.loads(body.decode(), salt=RELAY_SALT, max_age=RELAY_MAX_AGE_S)
    return data["group"], data["message"]


def _relay(group: str, message: dict) -> None:
    request = urllib.request.Request(
        settings.ARMATURE_WEB_URL + RELAY_PATH,
        data=sign_relay_payload(group, message),
        headers={"Content-Type": "text/plain"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=RELAY_TIMEOUT_S) as response:
        json.load(response)
