"""A sweep's live page: each step of the sweep (progress.advance) tells the sweep's
group, and every page watching it gets the header, trials table and importances that
changed as htmx fragments, then the charts' data as one JSON frame
(`{"type": "sweep", ...}`, frontend/static/armature/sweep_page.js)."""

import json

from channels.db import database_sync_to_async

from controlplane.access.sockets import GuardedConsumer
from controlplane.realtime.groups import sweep_group
from controlplane.runs.run_page import fragment_digest
from controlplane.sweeps.models import Sweep
from controlplane.sweeps.page import chart_data, live_fragments


class SweepConsumer(GuardedConsumer):
    async def connect(self) -> None:
        self.sweep_id = self.scope["url_route"]["kwargs"]["sweep_id"]
        self.group = sweep_group(self.sweep_id)
        self.sent: dict[str, str] = {}
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        await self._push()  # what changed between the page's render and now

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data='<div id="ws-error" hx-swap-oob="true" class="error">'
                        "This socket is read-only.</div>")  # fmt: skip

    async def sweep_changed(self, event: dict) -> None:
        await self._push()

    async def _push(self) -> None:
        parts, charts = await self._read()
        changed = {}
        for key, html in parts.items():
            digest = fragment_digest(html)
            if self.sent.get(key) != digest:
                self.sent[key], changed[key] = digest, html
        if changed:
            await self.send(text_data="".join(changed.values()))
        if charts is not None:
            await self.send(text_data=json.dumps({"type": "sweep", **charts}))

    @database_sync_to_async
    def _read(self) -> tuple[dict[str, str], dict | None]:
        sweep = Sweep.objects.filter(pk=self.sweep_id).first()
        if sweep is None:
            return {}, None
        return live_fragments(self.sweep_id, self.scope["user"]), chart_data(sweep)
