"""The control plane's end of a trainer's link (protocol in docs/link-protocol.md).

Thin on purpose: who may connect is the access table's call (controlplane/access/), and
validation and storage live in `runs.telemetry`. A link closes when its run ends.
Order per message: validate → store (one transaction) → ack → broadcast, so a browser
never sees a point the database does not have, and a lost broadcast loses nothing.
"""

import json
import logging

from channels.db import database_sync_to_async

from controlplane.access.sockets import (
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    GuardedConsumer,
    bearer_token,
)
from controlplane.realtime.groups import trainer_group
from controlplane.realtime.publish import publish_async
from controlplane.runs import telemetry

log = logging.getLogger(__name__)

__all__ = ["CLOSE_FORBIDDEN", "CLOSE_NOT_FOUND", "CLOSE_RUN_FINISHED", "TrainerConsumer"]

# Storage failed: the trainer reconnects and resends what was not acknowledged.
CLOSE_INTERNAL_ERROR = 1011
# The run reached a final state while its link was open: its token is spent. A 44xx
# code, so the trainer's client stops reconnecting (trainer.link.client.CLOSE_RUN_ENDED).
CLOSE_RUN_FINISHED = 4410


class TrainerConsumer(GuardedConsumer):
    """One trainer's link for one run. The access table lets in only the bearer of that
    run's token while the run is not final (controlplane/access/sockets.py)."""

    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        # The token the access check accepted names the attempt this link reports for.
        self.attempt = telemetry.link_attempt(bearer_token(self.scope.get("headers", [])))
        # Joined before accepting, so a run that ends from now on closes this link.
        self.group = trainer_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        # The run may have ended between the access check and joining the group.
        if await database_sync_to_async(telemetry.run_is_final)(self.run_id):
            await self.close(code=CLOSE_RUN_FINISHED)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def link_close(self, event: dict) -> None:
        """The run reached a final state (runs.state.transition tells its trainer group)."""
        log.info("run %s is %s: closing its trainer link", self.run_id, event.get("state"))
        await self.close(code=CLOSE_RUN_FINISHED)

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
