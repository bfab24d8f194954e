"""WebSocket consumers for browsers."""

import asyncio
import time

from django.conf import settings
from django.template.loader import render_to_string

from controlplane.access.sockets import CLOSE_UNAUTHENTICATED, GuardedConsumer
from controlplane.core.health import collect_status
from controlplane.realtime.groups import SYSTEM_STATUS

__all__ = ["CLOSE_UNAUTHENTICATED", "StatusConsumer"]


class StatusConsumer(GuardedConsumer):
    """Streams the system status panel (as htmx out-of-band HTML) to whoever the access
    table lets in.

    It re-checks on a timer and at once when another process asks (for example a
    Celery worker that just started), through the `system.status` group.
    """

    async def connect(self) -> None:
        await self.channel_layer.group_add(SYSTEM_STATUS, self.channel_name)
        await self.accept()
        self.poller = asyncio.create_task(self._poll())

    async def disconnect(self, code: int) -> None:
        poller = getattr(self, "poller", None)
        if poller is not None:
            poller.cancel()
            await self.channel_layer.group_discard(SYSTEM_STATUS, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(
            text_data=render_to_string(
                "core/_status_error.html",
                {"error": "The status socket is read-only: it accepts no messages."},
            )
        )

    async def status_refresh(self, event: dict) -> None:
        await self._push()

    async def _poll(self) -> None:
        while True:
            await self._push()
            await asyncio.sleep(settings.ARMATURE_STATUS_INTERVAL_S)

    async def _push(self) -> None:
        checks = await collect_status()
        html = render_to_string(
            "core/_status_panel.html", {"checks": checks, "checked_at": time.time()}
        )
        await self.send(text_data=html)
