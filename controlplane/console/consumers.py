"""The operator console's socket: one browser watching (and, for operators, driving) the
robots of one run. Thin: the safety rules live with the robots (trainer.envs.teleop),
who may drive (and who may clear another operator's e-stop) is the access table's call,
and the messages' shape is trainer.link.console_messages. Commands go to the run's
trainer link through its channel group; the trainer's live state comes back through the
run's console group.

The user's role is re-checked on every message (`ping` included) and on the shared
layer's timer (controlplane.access.sockets): one cache read of their role version; only
when it changed, the user and the session are read from the database again. A user who
may no longer do what the socket was doing has what they hold let go (`link_lost`) and
the socket closed: 4403 when they are logged in but may no longer drive (the page
reconnects as a viewer), 4401 when the session no longer logs them in (logged out,
password changed, deactivated, deleted).
"""

from __future__ import annotations

import json
import time
from typing import Any

from channels.db import database_sync_to_async

from controlplane.access.doors import SEE, verdict
from controlplane.access.sockets import (
    CLOSE_FORBIDDEN,
    CLOSE_NOT_FOUND,
    CLOSE_SERVER_ERROR,
    CLOSE_UNAUTHENTICATED,
    GuardedConsumer,
)
from controlplane.console import live
from controlplane.console.token_bucket import TokenBucket
from controlplane.realtime import local_links
from controlplane.realtime.groups import console_group, trainer_group
from controlplane.runs.models import Run
from trainer.link.console_messages import InvalidConsoleMessage, parse_teleop

CONTROL = "console-control"  # the part of this door that drives robots
CLEAR_ANY_STOP = "console-clear-any-stop"  # the part that clears others' e-stops
VIEW_OPS = {"watch"}
# A viewer's ops go down the run's link ahead of the operators' commands, which must
# reach the robots within a deadman's time: per socket, a burst of this many, then this
# many a second (a person picks a robot to watch a few times a minute).
VIEW_OPS_BURST, VIEW_OPS_PER_S = 10, 5.0
# Close reasons (docs/console.md, "Who may drive").
NO_LONGER_OPERATOR = "your role changed: driving needs the operator role"
REFUSAL_STATUS = {CLOSE_UNAUTHENTICATED: 401, CLOSE_FORBIDDEN: 403, CLOSE_SERVER_ERROR: 500}


class ConsoleConsumer(GuardedConsumer):
    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        self.operator = self.scope["user"].get_username()
        self.took_over = False
        # The links the run's robots were last heard by (source → time.monotonic): where
        # commands must reach.
        self.sources: dict[str | None, float] = {}
        self.view_ops = TokenBucket(VIEW_OPS_BURST, VIEW_OPS_PER_S)
        if not await database_sync_to_async(Run.objects.filter(pk=self.run_id).exists)():
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = console_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)
        await self._let_go()

    async def _let_go(self, held_or_not: bool = False) -> None:
        """Let go of what this operator holds, at once (their console is gone): when this
        socket took a robot over, or `held_or_not` (their other sockets may hold some)."""
        if getattr(self, "took_over", False) or held_or_not:
            self.took_over = False
            await self._to_trainer({"op": "link_lost"})

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        try:
            message = json.loads(text_data or "")
        except ValueError:
            message = None
        if not isinstance(message, dict) or not isinstance(message.get("op"), str):
            await self._send({"type": "error", "error": 'send JSON objects with an "op"'})
            return
        op = message["op"]
        if not await self.still_allowed(op):
            return  # closed: nothing of it reaches the trainer
        if op == "ping":  # the page's round-trip figure: an echo
            await self._send({"type": "pong", "t": message.get("t")})
            return
        if op in VIEW_OPS and not self.view_ops.take():
            await self._send({"type": "error", "op": op[:20], "error": (
                f"too many {op} messages: at most {VIEW_OPS_PER_S:g} a second"
            )})  # fmt: skip
            return
        if op not in VIEW_OPS:
            decision = verdict(self.scope["user"], CONTROL, SEE)
            if not decision.allowed:
                await self._send({"type": "refused", "status": 403, "op": op[:20],
                                  "error": decision.reason})  # fmt: skip
                return
        if op == "request":
            await self.channel_layer.group_send(
                self.group,
                {"type": "console.request", "robot": message.get("robot"), "by": self.operator},
            )
            return
        try:
            await self._to_trainer(message)
        except InvalidConsoleMessage as invalid:
            await self._send({"type": "error", "op": op[:20], "error": str(invalid)})
            return
        if op == "take_over":
            self.took_over = True

    async def still_allowed(self, op: str) -> bool:
        """The shared check, and an operator who may no longer drive is closed too (the
        page reconnects as a viewer). One cache read while nothing changed."""
        if getattr(self, "closed_for", None) is not None:
            return False
        could_drive = self._could_drive = verdict(self.scope["user"], CONTROL, SEE).allowed
        if not await super().still_allowed(op):
            return False
        if could_drive and not verdict(self.scope["user"], CONTROL, SEE).allowed:
            await self.close_for(op, CLOSE_FORBIDDEN, NO_LONGER_OPERATOR)
            return False
        return True

    async def close_for(self, op: str, code: int, reason: str) -> None:
        """Let go of what the user holds, say why (a last `refused` frame: not every
        server passes a close reason on), and close with `code`."""
        self.closed_for = reason
        await self._let_go(held_or_not=getattr(self, "_could_drive", True))
        await self._send({"type": "refused", "status": REFUSAL_STATUS[code], "op": op[:20],
                          "error": reason, "close": code})  # fmt: skip
        await super().close_for(op, code, reason)

    async def _to_trainer(self, message: dict[str, Any]) -> None:
        """Name the operator from the session, then validate. The command is stamped
        when it is written to the run's link (controlplane.console.stamps), not here:
        this process's clock may not be that one's."""
        override = (
            message.get("op") == "clear_stop"
            and verdict(self.scope["user"], CLEAR_ANY_STOP, SEE).allowed
        )
        teleop = parse_teleop(
            {**message, "type": "teleop", "operator": self.operator, "sent_at": None,
             "clock": None, "override": override}
        )  # fmt: skip
        event = {"type": "teleop.command", "message": teleop.model_dump(mode="json")}
        now = time.monotonic()
        # The processes known to step the run's robots (none known yet: any may).
        sources = {s for s, heard in self.sources.items() if now - heard < live.ONLINE_S}
        here = [link for link in local_links.of_run(self.run_id)
                if not sources or link.source in sources]  # fmt: skip
        for link in here:  # the run's links in this process: no channel-layer hop
            await link.teleop_command(event)
        # Through the group too, unless every such process has its link here: those
        # already served skip it.
        if not here or not sources or not sources <= {link.source for link in here}:
            delivered = [link.channel_name for link in here]
            await self.channel_layer.group_send(
                trainer_group(self.run_id), {**event, "delivered": delivered}
            )

    async def console_state(self, event: dict) -> None:
        message = event["message"]
        self.sources[message.get("source")] = time.monotonic()
        await self._send(message)

    async def console_request(self, event: dict) -> None:
        await self._send({"type": "request", "robot": event["robot"], "by": event["by"]})

    async def _send(self, message: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(message))
