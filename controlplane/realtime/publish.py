"""Publishing realtime messages to browser groups from any process.

With a shared channel layer (Redis) every process sends to it directly. With the
in-memory layer of the one-machine mode only the web server's own layer reaches
the browsers, so other processes (the Celery worker, management commands) relay
their messages to the web server over HTTP, signed with the secret key. Each relayed
message carries a nonce and the signature's timestamp: the web server accepts it once,
and only within RELAY_MAX_AGE_S of its signing. With a shared layer no process needs the
relay, and its URL is not mounted at all.
"""

import json
import secrets
import urllib.request

from asgiref.sync import async_to_sync
from channels.layers import InMemoryChannelLayer, get_channel_layer
from django.conf import settings
from django.core import signing

from controlplane.realtime.nonces import NonceRegister

RELAY_PATH = "/internal/realtime/publish"
RELAY_SALT = "armature.realtime.relay"
RELAY_MAX_AGE_S = 60
RELAY_TIMEOUT_S = 5
IN_MEMORY_LAYER = "channels.layers.InMemoryChannelLayer"

# Kept twice the age limit: a message signed a little in the future (the signer's clock)
# is still remembered for as long as it can pass the age check.
_seen_nonces = NonceRegister(remember_s=2 * RELAY_MAX_AGE_S)


class ReplayedMessage(Exception):
    """A relay message whose nonce was already accepted."""


_in_web_process = False


def mark_web_process() -> None:
    """Called by the ASGI application: this process owns the browsers' channel layer."""
    global _in_web_process
    _in_web_process = True


def relay_is_served() -> bool:
    """The relay endpoint exists only with the in-memory layer (the one-machine mode)."""
    return settings.CHANNEL_LAYERS["default"]["BACKEND"] == IN_MEMORY_LAYER


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
    payload = {"group": group, "message": message, "nonce": secrets.token_urlsafe(16)}
    return signing.dumps(payload, salt=RELAY_SALT).encode()


def unsign_relay_payload(body: bytes) -> tuple[str, dict]:
    """Return (group, message); raises signing.BadSignature on a forged or stale body,
    ReplayedMessage on one already accepted, KeyError/TypeError on one without a nonce."""
    data = signing.loads(body.decode(), salt=RELAY_SALT, max_age=RELAY_MAX_AGE_S)
    nonce = data["nonce"]
    if not isinstance(nonce, str) or not 16 <= len(nonce) <= 64:
        raise TypeError("the nonce must be a string of 16 to 64 characters")
    if not _seen_nonces.first_use(nonce):
        raise ReplayedMessage(nonce)
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
