"""The access table at the doors of WebSocket routes.

A refused socket is closed before the handshake completes, with a code that says why
(the trainer's link client gives up on any 44xx code instead of retrying). The table
says which rule a door follows; a door that takes a bearer token (the trainer's link)
has its consumer judge the token (`GuardedConsumer.token_refusal`), so this shared layer
knows no feature app.
"""

import logging

from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from controlplane.access.doors import CONNECT, DOORS, Answer, Rule, verdict

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


@database_sync_to_async
def role_refusal(scope: dict, door: str) -> int | None:
    """None when the user in `scope` may connect to `door`, else the close code."""
    decision = verdict(scope.get("user"), door, CONNECT)
    if decision.allowed:
        return None
    return CLOSE_UNAUTHENTICATED if decision.answer is Answer.LOG_IN else CLOSE_FORBIDDEN


def takes_a_token(door: str) -> bool:
    row = DOORS.get(door)
    return row is not None and row.rule(CONNECT) is Rule.RUN_TOKEN


class GuardedConsumer(AsyncWebsocketConsumer):
    """A consumer that lets nobody reach `connect` without the table's consent. The
    route names its door: `Consumer.as_asgi(door="ws-status")` (see realtime/routing.py);
    a consumer routed without one is closed to everybody."""

    door: str = ""

    async def token_refusal(self, token: str | None) -> int | None:
        """For a door that takes a bearer token: None when `token` opens it, else the
        close code. A consumer behind such a door says what its token must be; one that
        does not is closed to everybody."""
        return CLOSE_FORBIDDEN

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
        if takes_a_token(self.door):
            code = await self.token_refusal(bearer_token(self.scope.get("headers", [])))
        else:
            code = await role_refusal(self.scope, self.door)
        if code is not None:
            await self.close(code=code)
            return
        await super().websocket_connect(message)
