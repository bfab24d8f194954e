"""Live run pages: the runs list and one run's header follow state and progress."""

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from controlplane.access.sockets import GuardedConsumer
from controlplane.realtime.groups import RUNS_LIST, run_group
from controlplane.runs.models import Run


class RunUpdatesConsumer(GuardedConsumer):
    """Without a run id: every run's row on the runs list. With one: that run's header.
    Any message about a run (state, progress) re-renders its fragment from the database,
    so what the browser shows is what is stored."""

    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"].get("run_id")
        self.group = run_group(self.run_id) if self.run_id else RUNS_LIST
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        if self.run_id:  # anything that changed between the page load and now
            await self._push(self.run_id)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data='<div id="ws-error" hx-swap-oob="true" class="error">'
                        "This socket is read-only.</div>")  # fmt: skip

    async def run_state(self, event: dict) -> None:
        await self._push(event["run"])

    async def run_progress(self, event: dict) -> None:
        await self._push(event["run"])

    async def run_metrics(self, event: dict) -> None:
        """Charts arrive with the live-telemetry work; the header has nothing to show."""

    async def run_event(self, event: dict) -> None:
        """The timeline is rendered on load; events need no header update."""

    async def _push(self, run_id: int) -> None:
        html = await self._render(run_id)
        if html:
            await self.send(text_data=html)

    @database_sync_to_async
    def _render(self, run_id: int) -> str:
        run = (
            Run.objects.select_related("experiment", "revision", "created_by")
            .filter(pk=run_id)
            .first()
        )
        if run is None:
            return ""
        template = "runs/_run_header.html" if self.run_id else "runs/_run_row.html"
        return render_to_string(template, {"run": run, "oob": True})
