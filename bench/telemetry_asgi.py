"""The project's ASGI application plus two bare WebSocket routes for bench/telemetry.py's
latency baselines, on the same server process and event loop, nothing of ours on the
path:

- `/bench/echo/`: sends each message straight back (one socket, one hop).
- `/bench/relay/<n>/pub` and `/bench/relay/<n>/sub`: what a publisher sends is passed
  through the channel layer to every subscriber of `<n>` — the path a trainer's point
  takes to a browser, without validation, storage or acknowledgement.
"""

from channels.generic.websocket import AsyncWebsocketConsumer

from controlplane.asgi import application as project_application

ECHO_PATH = "/bench/echo/"
RELAY_PREFIX = "/bench/relay/"


class Echo(AsyncWebsocketConsumer):
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        await self.send(text_data=text_data, bytes_data=bytes_data)


class Relay(AsyncWebsocketConsumer):
    async def connect(self) -> None:
        name, self.role = self.scope["path"][len(RELAY_PREFIX) :].strip("/").split("/")
        self.group = f"bench-relay-{name}"
        if self.role == "sub":
            await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if self.role == "sub":
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        await self.channel_layer.group_send(self.group, {"type": "relay", "text": text_data})

    async def relay(self, event: dict) -> None:
        await self.send(text_data=event["text"])


_echo = Echo.as_asgi()
_relay = Relay.as_asgi()


async def application(scope, receive, send):
    if scope["type"] == "websocket" and scope["path"] == ECHO_PATH:
        return await _echo(scope, receive, send)
    if scope["type"] == "websocket" and scope["path"].startswith(RELAY_PREFIX):
        return await _relay(scope, receive, send)
    return await project_application(scope, receive, send)
