"""Live run pages: the runs list follows every run's state and progress; one run's page
gets its header, controls, events, placement, files and evaluations as htmx fragments,
and its metric points as JSON.

HTML fragments are re-rendered from the database, so what the browser shows is what is
stored. A socket sends a fragment only when it differs from the one it sent last, so an
update swaps only what changed; inside the header, which changes with every progress,
the controls keep their elements (hx-preserve, runs/_run_header.html). JSON frames
(`{"type": "metrics" | "progress", ...}`) are for the page's charts
(frontend/static/armature/run_page.js), which take them before htmx sees them; they
carry the stored message as broadcast by runs.telemetry.broadcast_messages. Only a
training run's page has that script: an eval run's page gets fragments alone, since
htmx would take a JSON frame for HTML to swap.
"""

import json
from urllib.parse import parse_qs

from channels.db import database_sync_to_async
from django.template.loader import render_to_string

from controlplane.access.sockets import GuardedConsumer
from controlplane.realtime.groups import RUNS_LIST, run_group
from controlplane.runs.models import Run, RunKind
from controlplane.runs.run_page import fragment_digest, live_fragments, parse_seen
from controlplane.runs.selectors import with_figures


class RunUpdatesConsumer(GuardedConsumer):
    """Without a run id: every run's row on the runs list. With one: that run's page."""

    async def connect(self) -> None:
        self.run_id = self.scope["url_route"]["kwargs"].get("run_id")
        self.group = run_group(self.run_id) if self.run_id else RUNS_LIST
        # Fragment id → digest of the HTML the page shows: what it was rendered with
        # (`?seen=`, run_page.seen_fragments), then what this socket sent last. (A socket
        # that reconnects starts again from the page's; fragments only move forward, so
        # at worst one is sent again.)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.sent: dict[str, str] = parse_seen(query.get("seen", [""])[0])
        self.charts = bool(self.run_id) and await self._has_charts(self.run_id)
        await self.channel_layer.group_add(self.group, self.channel_name)
        await self.accept()
        if self.run_id:  # anything that changed between the page load and now
            await self._push(self.run_id, events=True)

    async def disconnect(self, code: int) -> None:
        if getattr(self, "group", None):
            await self.channel_layer.group_discard(self.group, self.channel_name)

    async def receive(self, text_data: str | None = None, bytes_data: bytes | None = None) -> None:
        await self.send(text_data='<div id="ws-error" hx-swap-oob="true" class="error">'
                        "This socket is read-only.</div>")  # fmt: skip

    async def run_state(self, event: dict) -> None:
        await self._push(event["run"], events=bool(self.run_id))

    async def run_progress(self, event: dict) -> None:
        if self.charts:
            await self._send_json("progress", event, ("seq", "step", "total"))
        await self._push(event["run"])

    async def run_metrics(self, event: dict) -> None:
        if self.charts:
            await self._send_json("metrics", event, ("seq", "step", "time", "values"))

    async def run_event(self, event: dict) -> None:
        # The header too: a trainer's event (started, finished) may have moved the state.
        if self.run_id:
            await self._push(event["run"], events=True)

    async def run_evaluation(self, event: dict) -> None:
        """One of this run's eval runs changed state (runs.state): its evaluations card."""
        if self.run_id:
            await self._push(event["run"], events=True)

    async def run_batch(self, event: dict) -> None:
        """Several stored messages published at once (runs.telemetry.broadcast_batches):
        their JSON frames in order, then the fragments once (they are re-read from the
        database, so one render shows what all of them changed)."""
        render: dict[int, bool] = {}  # run id → with its events list
        for inner in event["events"]:
            kind = inner["type"]
            if kind == "run.metrics":
                await self.run_metrics(inner)
            elif kind == "run.progress":
                if self.charts:
                    await self._send_json("progress", inner, ("seq", "step", "total"))
                render.setdefault(inner["run"], False)
            elif kind in ("run.event", "run.state"):
                render[inner["run"]] = bool(self.run_id)
            else:
                await self.dispatch(inner)
        for run_id, events in render.items():
            await self._push(run_id, events=events)

    async def _send_json(self, kind: str, event: dict, fields: tuple[str, ...]) -> None:
        frame = {"type": kind, "run": event["run"], **{name: event[name] for name in fields}}
        await self.send(text_data=json.dumps(frame))

    async def _push(self, run_id: int, events: bool = False) -> None:
        """Send the run's fragments that differ from what this socket sent last."""
        parts = await self._render(run_id, events)
        changed = {}
        for key, html in parts.items():
            digest = fragment_digest(html)
            if self.sent.get(key) != digest:
                self.sent[key] = digest
                changed[key] = html
        if changed:
            await self.send(text_data="".join(changed.values()))

    @database_sync_to_async
    def _has_charts(self, run_id: int) -> bool:
        """Whether the run's page takes JSON frames: a training run's (an eval run's
        page has no charts; the kind of a run never changes)."""
        return Run.objects.filter(pk=run_id).exclude(kind=RunKind.EVAL).exists()

    @database_sync_to_async
    def _render(self, run_id: int, events: bool) -> dict[str, str]:
        """On the runs list, the run's row; on its page, `run_page.live_fragments`."""
        if self.run_id:
            return live_fragments(run_id, self.scope["user"], events)
        run = with_figures(Run.objects.select_related("experiment", "revision", "created_by"))
        run = run.filter(pk=run_id).first()
        if run is None:
            return {}
        return {
            f"run-row-{run.pk}": render_to_string("runs/_run_row.html", {"run": run, "oob": True})
        }
