"""The control plane's end of a trainer's link (protocol in docs/link-protocol.md).

Thin on purpose: who may connect is the access table's call (controlplane/access/), and
validation and storage live in `runs.telemetry`.
Order per message: validate → store (one transaction) → ack → broadcast, so a browser
never sees a point the database does not have, and a lost broadcast loses nothing.
"""

import json
import logging

from channels.db import database_sync_to_async

from controlplane.access.sockets import CLOSE_FORBIDDEN, CLOSE_NOT_FOUND, GuardedConsumer
from controlplane.realtime.publish import publish_async
from controlplane.runs import telemetry

log = logging.getLogger(__name__)

__all__ = ["CLOSE_FORBIDDEN", "CLOSE_NOT_FOUND", "TrainerConsumer"]

# Storage failed: the trainer reconnects and resends what was not acknowledged.
CLOSE_INTERNAL_ERROR = 1011


class TrainerConsumer(GuardedConsumer):
    """One trainer's link for one run. The access table lets in only the bearer of that
    run's token while the run is not final (controlplane/access/sockets.py)."""

    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        await self.accept()

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if text_data is None:
            await self._reply({"type": "error", "seq": None, "error": "send text frames"})
            return
        try:
            message = telemetry.parse_message(text_data)
        except telemetry.InvalidMessage as invalid:
            await self._reply({"type": "error", "seq": invalid.seq, "error": invalid.error})
            return
        try:
            stored = await database_sync_to_async(telemetry.record)(self.run_id, message)
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
