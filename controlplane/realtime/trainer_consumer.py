"""The control plane's end of a trainer's link (protocol in docs/link-protocol.md).

Thin on purpose: who may connect is the access table's call (controlplane/access/), and
validation and storage live in `runs.telemetry`. A link closes when its run ends.
Order per message: validate → store (committed) → ack → broadcast, so a browser never
sees a point the database does not have, and a lost broadcast loses nothing. Messages
that arrive while a write is under way are stored together in the next transaction
(group commit: one commit for many messages when the trainer sends faster than one
commit takes), then acknowledged in order.

What a link holds in memory is bounded: a trainer keeps at most MAX_IN_FLIGHT messages
unanswered (trainer.link.protocol), so a link with more waiting here (the inbox and the
write under way) is closed (CLOSE_TOO_MANY_IN_FLIGHT); stored messages waiting to be
broadcast are bounded too (MAX_OUTBOX), and refused frames are counted without waiting
on the database.
"""

import asyncio
import json
import logging
import time

from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from django.db import connection

from controlplane.access.sockets import (
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    CLOSE_UNAUTHENTICATED,
    GuardedConsumer,
    bearer_token,
)
from controlplane.console import live
from controlplane.console.stamps import stamped_command
from controlplane.realtime import local_links
from controlplane.realtime.groups import console_group, trainer_group
from controlplane.realtime.publish import publish_async
from controlplane.runs import telemetry
from trainer.link.console_messages import (
    LEARNER_SOURCE,
    ROBOT_SOURCE,
    SOURCE_HEADER,
    InvalidConsoleMessage,
    parse_console,
)
from trainer.link.protocol import CLOSE_TOO_MANY_IN_FLIGHT, MAX_IN_FLIGHT

log = logging.getLogger(__name__)

__all__ = ["CLOSE_FORBIDDEN", "CLOSE_NOT_FOUND", "CLOSE_RUN_FINISHED", "TrainerConsumer"]

# Storage failed: the trainer reconnects and resends what was not acknowledged.
# (An application may close only with 1000 or 3000-4999: not 1011. Outside 44xx, so
# the trainer's client reconnects.)
CLOSE_INTERNAL_ERROR = 4011
# The run reached a final state while its link was open: its token is spent. A 44xx
# code, so the trainer's client stops reconnecting (trainer.link.client.CLOSE_RUN_ENDED).
CLOSE_RUN_FINISHED = 4410


def _store(
    run_id: int, batch: list[dict], attempt: int, known_keys: dict[str, int]
) -> tuple[list[bool], set[str]]:
    """`telemetry.record_many` on this pool thread's kept connection: which messages were
    new, and the metric keys refused (past the run's cap). Unlike
    `database_sync_to_async` it does not health-check the connection first (a round
    trip per write); a connection that failed is closed here instead, and the next
    write opens a new one."""
    refused: set[str] = set()
    try:
        stored = telemetry.record_many(
            run_id, batch, attempt, known_keys=known_keys, refused_keys=refused
        )
    except Exception:
        connection.close()
        raise
    if connection.close_at is not None and time.monotonic() >= connection.close_at:
        connection.close()  # older than DB_CONN_MAX_AGE
    return stored, refused


# Writes run in the thread pool, not in the one thread that `database_sync_to_async`
# shares with every consumer: there, each incoming message's dispatch would queue behind
# the write under way, so messages could never gather into one transaction. The writer
# task keeps one link's writes in order; each pool thread keeps its own connection.
store_in_pool = sync_to_async(_store, thread_sensitive=False)
# Messages stored in one transaction at most: a replayed spool is taken in slices, each
# acknowledged as soon as it is committed.
MAX_BATCH = 100
# Stored messages waiting to be broadcast, at most (the oldest are dropped past it, when
# the channel layer is slower than the database: browsers read back what they missed).
# A publish takes a batch at a time, far faster than a write: normally a batch or two wait.
MAX_OUTBOX = MAX_IN_FLIGHT
# Console messages: `"type": "console"` opens them (trainer.link.console_messages).
CONSOLE_PREFIX = '"console"'
MAX_CONSOLE_CHARS = 2_000_000
REMEMBER_EVERY_S = 0.5  # how often the robots online are updated from a run's stream
REFUSAL_CODES = {
    telemetry.Refusal.NO_TOKEN: CLOSE_UNAUTHENTICATED,
    telemetry.Refusal.WRONG_RUN: CLOSE_FORBIDDEN,
    telemetry.Refusal.OLD_ATTEMPT: CLOSE_FORBIDDEN,
    telemetry.Refusal.RUN_FINISHED: CLOSE_FORBIDDEN,
    telemetry.Refusal.NO_SUCH_RUN: CLOSE_NOT_FOUND,
}


def link_source(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Which of a run's processes a link is: the run's own (no source header) or a
    robot link (`env-<rank>`, `actor-<rank>`); None for a header naming neither."""
    wanted = SOURCE_HEADER.lower().encode()
    for name, value in headers:
        if name.lower() == wanted:
            source = value.decode("latin1")
            return source if ROBOT_SOURCE.fullmatch(source) else None
    return LEARNER_SOURCE


class TrainerConsumer(GuardedConsumer):
    """One trainer's link for one run. Its door takes a run token (the access table,
    controlplane/access/): only the bearer of the run's token for its current attempt
    gets in, while the run is not final.

    Besides the run's own link, each placed process that steps robots opens a robot
    link with the same token, naming itself (SOURCE_HEADER): it carries console
    messages and operators' commands only; stored messages come by the run's link."""

    async def token_refusal(self, token: str | None) -> int | None:
        if link_source(self.scope.get("headers", [])) is None:
            log.info("trainer link refused: %s names no process", SOURCE_HEADER)
            return CLOSE_FORBIDDEN
        run_id = self.scope["url_route"]["kwargs"]["run_id"]
        refused = await database_sync_to_async(telemetry.link_refusal)(run_id, token)
        if refused is None:
            return None
        log.info("trainer link for run %s refused: %s", run_id, refused.value)
        return REFUSAL_CODES[refused]

    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        # The token the access check accepted names the attempt this link reports for.
        headers = self.scope.get("headers", [])
        self.attempt = telemetry.link_attempt(bearer_token(headers))
        self.source = link_source(headers)
        # Joined before accepting, so a run that ends from now on closes this link.
        self.group = trainer_group(self.run_id)
        self.known_keys: dict[str, int] = {}  # the run's metric key rows, once looked up
        self.inbox: list[dict] = []  # valid messages waiting for the next write
        self.writer: asyncio.Task | None = None
        self.outbox: list[dict] = []  # stored messages waiting to be broadcast
        self.broadcaster: asyncio.Task | None = None
        self.remembered_at = 0.0
        self.unanswered = 0  # valid messages received and not yet acknowledged
        self.most_unanswered = 0  # the most there were at once (for tests and logs)
        self.closing = False  # closed by this end: frames still arriving are not read
        self.rejected = 0  # refused frames not yet counted on the run
        self.counter: asyncio.Task | None = None
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        local_links.add(self.run_id, self)
        # The run may have ended between the access check and joining the group.
        if await database_sync_to_async(telemetry.run_is_final)(self.run_id):
            await self.close(code=CLOSE_RUN_FINISHED)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            local_links.discard(self.run_id, self)
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def link_close(self, event: dict) -> None:
        """The run reached a final state (runs.state.transition tells its trainer group)."""
        log.info("run %s is %s: closing its trainer link", self.run_id, event.get("state"))
        # The write that ended the run (its `finished` event) is acknowledged first.
        if self.writer is not None and not self.writer.done():
            await asyncio.shield(self.writer)
        await self.close(code=CLOSE_RUN_FINISHED)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        if self.closing:
            return
        if text_data is not None and CONSOLE_PREFIX in text_data[:40]:
            await self._console(text_data)
            return
        try:
            if text_data is None:
                raise telemetry.InvalidMessage("send text frames")
            if self.source != LEARNER_SOURCE:  # one numbered sequence per attempt
                raise telemetry.InvalidMessage(
                    f"the robot link {self.source} carries console messages only"
                )
            message = telemetry.parse_message(text_data)
        except telemetry.InvalidMessage as invalid:
            log.info("run %s: refused a message: %s", self.run_id, invalid.error)
            self._count_rejected()
            await self._reply({"type": "error", "seq": invalid.seq, "error": invalid.error})
            return
        self.unanswered += 1
        self.most_unanswered = max(self.most_unanswered, self.unanswered)
        if self.unanswered > MAX_IN_FLIGHT:
            await self._close_too_many_in_flight()
            return
        self.inbox.append(message)
        if self.writer is None or self.writer.done():
            self.writer = asyncio.ensure_future(self._write())

    async def _close_too_many_in_flight(self) -> None:
        """The trainer sent more than the protocol's window without waiting for answers:
        the link is closed and what waits here dropped (unacknowledged, so a trainer that
        reconnects sends it again), rather than memory growing with the flood."""
        log.warning("run %s: more than %d messages in flight; closing the link (%d)",
                    self.run_id, MAX_IN_FLIGHT, CLOSE_TOO_MANY_IN_FLIGHT)  # fmt: skip
        self.closing = True
        self.inbox.clear()
        await self.close(code=CLOSE_TOO_MANY_IN_FLIGHT)

    def _count_rejected(self) -> None:
        """Count a refused frame on the run, many per database write, in the background:
        a stream of bad frames is answered as fast as it comes."""
        self.rejected += 1
        if self.counter is None or self.counter.done():
            self.counter = asyncio.ensure_future(self._save_rejected())

    async def _save_rejected(self) -> None:
        while self.rejected:
            count, self.rejected = self.rejected, 0
            try:
                await database_sync_to_async(telemetry.count_rejected)(self.run_id, count)
            except Exception:  # only a count: never worth the link
                log.warning("run %s: could not count %d refused messages", self.run_id,
                            count, exc_info=True)  # fmt: skip

    async def _console(self, text: str) -> None:
        """A live console message: checked, passed to the run's consoles, and kept as
        the run's robots online; never stored, never acknowledged."""
        try:
            if len(text) > MAX_CONSOLE_CHARS:
                raise InvalidConsoleMessage(f"longer than {MAX_CONSOLE_CHARS} characters")
            console = parse_console(json.loads(text)).model_dump(mode="json")
            console["source"] = self.source  # the link's, whatever the trainer said
        except (ValueError, InvalidConsoleMessage) as invalid:
            log.info("run %s: refused a console message: %s", self.run_id, invalid)
            await self._reply({"type": "error", "seq": None, "error": f"console: {invalid}"})
            return
        await publish_async(console_group(self.run_id), {"type": "console.state",
                                                         "message": console})  # fmt: skip
        now = time.monotonic()
        if now - self.remembered_at >= REMEMBER_EVERY_S or console["replies"]:
            self.remembered_at = now
            await sync_to_async(live.remember)(self.run_id, console, self.source)

    async def teleop_command(self, event: dict) -> None:
        """An operator's command from a console (controlplane.console.consumers), stamped
        with this process's monotonic clock as it is written to the link: the trainer
        judges the command's age on that one clock (controlplane.console.stamps). One
        that a console in this process handed it directly comes again through the
        group, for the run's links elsewhere, and is not sent twice."""
        if self.channel_name in event.get("delivered", ()):
            return
        await self.send(text_data=stamped_command(event["message"]))

    async def _write(self) -> None:
        """Store what is in the inbox in one transaction, acknowledge, broadcast; again
        while messages keep arriving."""
        while self.inbox:
            batch, self.inbox = self.inbox[:MAX_BATCH], self.inbox[MAX_BATCH:]
            try:
                stored, refused = await store_in_pool(
                    self.run_id, batch, self.attempt, self.known_keys
                )
            except Exception:
                log.exception("run %s: could not store %d messages", self.run_id, len(batch))
                self.known_keys.clear()  # rows made in the failed transaction are gone
                self.inbox.clear()  # unacknowledged: the trainer resends them
                self.closing = True
                await self.close(code=CLOSE_INTERNAL_ERROR)
                return
            if self.counter is not None and not self.counter.done():
                # Frames refused before these messages are counted before they are acked.
                await asyncio.shield(self.counter)
            for message in batch:
                await self._reply(telemetry.ack(message, refused))
                self.unanswered -= 1
            # Broadcast beside the next write, not before it: publishing to the channel
            # layer then overlaps the next commit.
            self.outbox += [message for message, new in zip(batch, stored, strict=True) if new]
            if len(self.outbox) > MAX_OUTBOX:
                log.warning("run %s: broadcasts fall behind; %d left out", self.run_id,
                            len(self.outbox) - MAX_OUTBOX)  # fmt: skip
                del self.outbox[:-MAX_OUTBOX]
            if self.outbox and (self.broadcaster is None or self.broadcaster.done()):
                self.broadcaster = asyncio.ensure_future(self._broadcast())

    async def _reply(self, reply: dict) -> None:
        if not self.closing:
            await self.send(text_data=json.dumps(reply))

    async def _broadcast(self) -> None:
        """Tell browsers about stored messages, in order, many per publish."""
        while self.outbox:
            messages, self.outbox = self.outbox[:MAX_BATCH], self.outbox[MAX_BATCH:]
            for group, event in telemetry.broadcast_batches(self.run_id, messages):
                try:
                    await publish_async(group, event)
                except Exception:  # stored already; browsers refetch what they missed
                    log.warning("run %s: broadcast to %s failed", self.run_id, group,
                                exc_info=True)  # fmt: skip
