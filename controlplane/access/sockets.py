"""The access table at the doors of WebSocket routes.

A refused socket is closed before the handshake completes, with a code that says why
(the trainer's link client gives up on any 44xx code instead of retrying). The table
says which rule a door follows; a door that takes a bearer token (the trainer's link)
has its consumer judge the token (`GuardedConsumer.token_refusal`), so this shared layer
knows no feature app.

A browser's socket is one long request: what let it in is read again while it is open.
Every `ARMATURE_SOCKET_RECHECK_S` (and on every message a consumer chooses) it reads its
user's role version, one cache read (role_versions.py); when that changed, the user and
the session are read from the database again, and a socket whose session no longer logs
them in (logged out, password changed, deactivated, deleted) closes with 4401, one whose
door the user may no longer open with 4403.
"""

import asyncio
import contextlib
import logging

from asgiref.sync import sync_to_async
from channels.consumer import get_handler_name
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser

from controlplane.access import role_versions
from controlplane.access.doors import CONNECT, DOORS, Answer, Rule, verdict

log = logging.getLogger(__name__)

CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
CLOSE_SERVER_ERROR = 1011
# Close reasons (docs/permissions.md, "Open sockets").
NO_LONGER_LOGGED_IN = "your session no longer logs you in: log in again"
NO_LONGER_ALLOWED = "your role changed: you may no longer open this"


# Role versions are read off the one thread Django's sync code shares with every consumer
# (database_sync_to_async): a cache read must not queue behind database work.
current_role_version = sync_to_async(role_versions.current, thread_sensitive=False)


def bearer_token(headers: list[tuple[bytes, bytes]]) -> str | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
    return None


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
            code = await database_sync_to_async(self._login_refusal)()
            if code is None:
                self._login_watch = asyncio.create_task(self._watch_login())
        if code is not None:
            await self.close(code=code)
            return
        await super().websocket_connect(message)

    async def websocket_disconnect(self, message: dict) -> None:
        watch = getattr(self, "_login_watch", None)
        if watch is not None:
            watch.cancel()
        await super().websocket_disconnect(message)

    # ----- the login, while the socket is open -------------------------------------------
    def _login_refusal(self) -> int | None:
        """None when the user may open this door, else the close code. One hop to the
        database thread, all of it: the handshake waits on it. The version this socket
        starts from is noted before the user is read afresh (a change made since the
        request's middleware loaded them shows)."""
        decision = verdict(self.scope.get("user"), self.door, CONNECT)
        if not decision.allowed:
            return CLOSE_UNAUTHENTICATED if decision.answer is Answer.LOG_IN else CLOSE_FORBIDDEN
        self.user_id = self.scope["user"].pk
        session = self.scope.get("session")
        self.session_key = session.session_key if session is not None else None
        return None if self._read_login() is not None else CLOSE_UNAUTHENTICATED

    async def _watch_login(self) -> None:
        try:
            while await self.still_allowed("recheck"):
                await asyncio.sleep(settings.ARMATURE_SOCKET_RECHECK_S)
        except asyncio.CancelledError:
            raise
        except Exception:  # the cache or the database away: a socket never goes unchecked
            log.exception("could not re-check the login of a %s socket; closing it", self.door)
            await self.close_for("recheck", CLOSE_SERVER_ERROR, "the server could not "
                                 "re-check your login; the page reconnects")  # fmt: skip

    def _read_login(self) -> AbstractBaseUser | None:
        """Read the socket's user (and role) afresh, after the role version it now goes
        by, so that any later change shows as a new version. None when the session no
        longer logs that user in."""
        self.role_version = role_versions.seen_at_connect(self.user_id)
        user = role_versions.logged_in_user(self.session_key)
        if user is None or user.pk != self.user_id:
            return None
        self.scope["user"] = user
        return user

    async def still_allowed(self, op: str) -> bool:
        """Whether the user may still use this socket; if not, it is closed (`op`: what
        was being done, for a consumer that says so). One cache read while nothing
        changed."""
        if getattr(self, "closed_for", None) is not None:
            return False
        version = await current_role_version(self.user_id)
        if version is not None and version == self.role_version:
            return True
        user = await database_sync_to_async(self._read_login)()
        if user is None:
            await self.close_for(op, CLOSE_UNAUTHENTICATED, NO_LONGER_LOGGED_IN)
            return False
        if not verdict(user, self.door, CONNECT).allowed:
            await self.close_for(op, CLOSE_FORBIDDEN, NO_LONGER_ALLOWED)
            return False
        return True

    async def close_for(self, op: str, code: int, reason: str) -> None:
        """Close the socket for `reason`; a consumer may first say so in its own terms."""
        self.closed_for = reason
        with contextlib.suppress(Exception):  # the client may already be gone
            await self.close(code=code, reason=reason)
