"""The control plane's end of a trainer's link (protocol in docs/link-protocol.md).

Thin on purpose: authentication, validation and storage live in `runs.telemetry`.
Order per message: validate → store (one transaction) → ack → broadcast, so a browser
never sees a point the database does not have, and a lost broadcast loses nothing.
"""

import json
import logging

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncWebsocketConsumer

from controlplane.realtime.consumers import CLOSE_UNAUTHENTICATED
from controlplane.realtime.publish import publish_async
from controlplane.runs import telemetry

log = logging.getLogger(__name__)

CLOSE_FORBIDDEN = 4403
CLOSE_NOT_FOUND = 4404
# Storage failed: the trainer reconnects and resends what was not acknowledged.
CLOSE_INTERNAL_ERROR = 1011

CLOSE_CODES = {
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


class TrainerConsumer(AsyncWebsocketConsumer):
    """One trainer's link for one run, authenticated by that run's token."""

    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        token = bearer_token(self.scope.get("headers", []))
        refusal = await database_sync_to_async(telemetry.link_refusal)(self.run_id, token)
        if refusal is not None:
            log.info("trainer link for run %s refused: %s", self.run_id, refusal.value)
            await self.close(code=CLOSE_CODES[refusal])
            return
        self.attempt = telemetry.link_attempt(token)
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            if text_data is None:
                raise telemetry.InvalidMessage("send text frames")
            message = telemetry.parse_message(text_data)
        except telemetry.InvalidMessage as invalid:
            log.info("run %s: refused a message: %s", self.run_id, invalid.error)
            await database_sync_to_async(telemetry.count_rejected)(self.run_id)
            await self._reply({"type": "error", "seq": invalid.seq, "error": invalid.error})
            return
        try:
            stored = await database_sync_to_async(telemetry.record)(
                self.run_id, message, self.attempt
            )
        except Exception:
            log.exception("run %s: could not store message %s", self.run_id, message["seq"])
            await self.close(code=CLOSE_INTERNAL_ERROR)
            return
        await self._reply({"type": "ack", "seq": message["seq"]})
        if stored:
            await self._broadcast(message)

    async def _reply(self, reply: dict) -> None:
        await self.send(text_data=json.dumps(reply))

    async def _broadcast(self, message: dict) -> None:
        for group, event in telemetry.broadcast_messages(self.run_id, message):
            try:
                await publish_async(group, event)
            except Exception:  # stored already; browsers refetch what they missed
                log.warning("run %s: broadcast to %s failed", self.run_id, group, exc_info=True)
