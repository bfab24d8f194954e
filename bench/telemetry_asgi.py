"""The project's ASGI application plus one bare WebSocket echo route, for
bench/telemetry.py's latency baseline: the same server process, the same event loop,
nothing of ours on the path."""

from channels.generic.websocket import AsyncWebsocketConsumer

from controlplane.asgi import application as project_application

ECHO_PATH = "/bench/echo/"


class Echo(AsyncWebsocketConsumer):
    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None):
        await self.send(text_data=text_data, bytes_data=bytes_data)


_echo = Echo.as_asgi()


async def application(scope, receive, send):
    if scope["type"] == "websocket" and scope["path"] == ECHO_PATH:
        return await _echo(scope, receive, send)
    return await project_application(scope, receive, send)
