"""The operator console's socket: one browser watching (and, for operators, driving) the
robots of one run. Thin: the safety rules live with the robots (trainer.envs.teleop),
who may drive is the access table's call, and the messages' shape is
trainer.link.console_messages. Commands go to the run's trainer link through its channel
group; the trainer's live state comes back through the run's console group.
"""

from __future__ import annotations

import json
import time
from typing import Any

from channels.db import database_sync_to_async

from controlplane.access.doors import SEE, verdict
from controlplane.access.sockets import CLOSE_NOT_FOUND, GuardedConsumer
from controlplane.realtime import local_links
from controlplane.realtime.groups import console_group, trainer_group
from controlplane.runs.models import Run
from trainer.link.console_messages import InvalidConsoleMessage, parse_teleop

CONTROL = "console-control"  # the part of this door that drives robots
VIEW_OPS = {"watch"}


class ConsoleConsumer(GuardedConsumer):
    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"]["run_id"]
        self.operator = self.scope["user"].get_username()
        self.took_over = False
        if not await database_sync_to_async(Run.objects.filter(pk=self.run_id).exists)():
            await self.close(code=CLOSE_NOT_FOUND)
            return
        self.group = console_group(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)
        if getattr(self, "took_over", False):  # let go of what this operator held, at once
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
        if op == "ping":  # the page's round-trip figure
            await self._send({"type": "pong", "t": message.get("t")})
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

    async def _to_trainer(self, message: dict[str, Any]) -> None:
        """Name the operator from the session and stamp the arrival, then validate."""
        teleop = parse_teleop(
            {**message, "type": "teleop", "operator": self.operator, "sent_at": time.time()}
        )
        event = {"type": "teleop.command", "message": teleop.model_dump(mode="json")}
        here = local_links.of_run(self.run_id)
        if not here:
            await self.channel_layer.group_send(trainer_group(self.run_id), event)
        for link in here:  # the run's link is in this process: no channel-layer hop
            await link.teleop_command(event)

    async def console_state(self, event: dict) -> None:
        await self._send(event["message"])

    async def console_request(self, event: dict) -> None:
        await self._send({"type": "request", "robot": event["robot"], "by": event["by"]})

    async def _send(self, message: dict[str, Any]) -> None:
        await self.send(text_data=json.dumps(message))
