"""A trainer's link in tests, through the project's WebSocket routing in this process:
opened with the run's token, and messages sent the way a trainer sends them."""

import json

from channels.testing import WebsocketCommunicator

from controlplane.realtime.routing import websocket_application
from controlplane.runs.models import Run
from controlplane.runs.tokens import make_run_token


async def trainer(run: Run) -> WebsocketCommunicator:
    socket = WebsocketCommunicator(
        websocket_application, f"/ws/trainer/{run.pk}/",
        headers=[(b"authorization", f"Bearer {make_run_token(run.pk)}".encode())],
    )  # fmt: skip
    connected, code = await socket.connect()
    assert connected, code
    return socket


async def send(link: WebsocketCommunicator, message: dict) -> None:
    """Send a protocol v1 message and wait for its acknowledgement."""
    await link.send_to(text_data=json.dumps({"v": 1, **message}))
    assert json.loads(await link.receive_from(timeout=10))["type"] == "ack"
