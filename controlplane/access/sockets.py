"""The access table at the doors of WebSocket routes.

A refused socket is closed before the handshake completes, with a code that says why
(the trainer's link client gives up on any 44xx code instead of retrying).
"""

import logging

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from controlplane.access.doors import CONNECT, DOORS, Answer, Rule, verdict
from controlplane.runs import telemetry

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404

REFUSAL_CODES = {
    telemetry.Refusal.NO_TOKEN: CLOSE_UNAUTHENTICATED,
    telemetry.Refusal.WRONG_RUN: CLOSE_FORBIDDEN,
    telemetry.Refusal.OLD_ATTEMPT: CLOSE_FORBIDDEN,
    telemetry.Refusal.RUN_FINISHED: CLOSE_FORBIDDEN,
    telemetry.Refusal.NO_SUCH_RUN: CLOSE_NOT_FOUND,
}


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


@database_sync_to_async
def refusal_code(scope: dict, door: str) -> int | None:
    """None when the caller in `scope` may connect to `door`, else the close code."""
    row = DOORS.get(door)
    if row is not None and row.rule(CONNECT) is Rule.RUN_TOKEN:
        run_id = scope["url_route"]["kwargs"]["run_id"]
        refused = telemetry.link_refusal(run_id, bearer_token(scope.get("headers", [])))
        if refused is None:
            return None
        log.info("trainer link for run %s refused: %s", run_id, refused.value)
        return REFUSAL_CODES[refused]
    decision = verdict(scope.get("user"), door, CONNECT)
    if decision.allowed:
        return None
    return CLOSE_UNAUTHENTICATED if decision.answer is Answer.LOG_IN else CLOSE_FORBIDDEN


class GuardedConsumer(AsyncWebsocketConsumer):
    """A consumer that lets nobody reach `connect` without the table's consent. The
    route names its door: `Consumer.as_asgi(door="ws-status")` (see realtime/routing.py);
    a consumer routed without one is closed to everybody."""

    door: str = ""

    def __init__(self, *args, door: str = "", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.door = door or self.door

    async def dispatch(self, message: dict) -> None:
        """Channels' own dispatch first closes stale database connections, a hop to the
        one thread it shares with every consumer, for every frame and every channel-layer
        message. Under a trainer's stream those hops queue behind each other and the
        consumers fall behind (browsers' channels overflow). Ours reach the database only
        through `database_sync_to_async`, which closes stale connections around each
        call, so the hop is skipped."""
        handler = getattr(self, get_handler_name(message), None)
        if handler is None:
            raise ValueError(f"No handler for message type {message['type']}")
        await handler(message)

    async def websocket_connect(self, message: dict) -> None:
        code = await refusal_code(self.scope, self.door)
        if code is not None:
            await self.close(code=code)
            return
        await super().websocket_connect(message)
