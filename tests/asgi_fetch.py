"""A GET through Django's ASGI handler, called as daphne calls it: the status, headers,
the body's size and its first and last bytes, and the peak of the memory the process's
Python allocated meanwhile (what one download costs the web server)."""

import asyncio
import tracemalloc
from dataclasses import dataclass, field

from asgiref.sync import async_to_sync
from django.core import signals
from django.core.handlers.asgi import ASGIHandler
from django.db import close_old_connections

HEAD_BYTES = 4096


@dataclass
class Fetched:
    status: int = 0
    headers: dict = field(default_factory=dict)
    size: int = 0
    head: bytes = b""
    tail: bytes = b""
    peak: int = 0


def fetch_through_asgi(path: str, query: str, headers: dict[str, str]) -> Fetched:
    fetched = Fetched()
    asked = False

    async def receive() -> dict:
        nonlocal asked
        if not asked:
            asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays until the answer is sent

    async def send(message: dict) -> None:
        if message["type"] == "http.response.start":
            fetched.status = message["status"]
            fetched.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        else:
            body = message.get("body", b"")
            fetched.size += len(body)
            if len(fetched.head) < HEAD_BYTES:
                fetched.head = (fetched.head + body)[:HEAD_BYTES]
            fetched.tail = (fetched.tail + body)[-1000:]

    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET",
        "scheme": "http", "path": path, "raw_path": path.encode(),
        "query_string": query.encode(), "root_path": "",
        "headers": [(b"host", b"testserver")]
        + [(name.lower().encode(), value.encode()) for name, value in headers.items()],
        "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
    }  # fmt: skip
    # As Django's own test client does: the request must not close the test's
    # connection, which holds the test's transaction.
    signals.request_started.disconnect(close_old_connections)
    signals.request_finished.disconnect(close_old_connections)
    tracemalloc.start()
    try:
        async_to_sync(ASGIHandler())(scope, receive, send)
        fetched.peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        signals.request_started.connect(close_old_connections)
        signals.request_finished.connect(close_old_connections)
    return fetched
