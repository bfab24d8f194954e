"""Servers that a robot's or camera's address may lead to, for tests of what the
hardware clients refuse: an HTTP server on 127.0.0.1 that answers every GET and POST
the way a test says (an endless body, an MJPEG frame that never ends, a redirect, a
picture declaring a huge size) and records each request; a port where nothing listens;
and a host that takes connections and never answers."""

from __future__ import annotations

import io
import socket
import struct
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from PIL import Image

Answer = Callable[[BaseHTTPRequestHandler, "HostileServer"], None]
PIECE = b"\x00" * (64 * 1024)  # holds no JPEG marker: a frame's bytes that never end


class HostileServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # method, path, headers
        self.sent = 0  # body bytes written by the answers that stream
        self.done = threading.Event()  # an answer that streams has written all it meant to
        self.stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    def url(self, path: str = "") -> str:
        return f"http://127.0.0.1:{self.port}/{path}"

    def stop(self) -> None:
        self.stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                self._answer()

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                if length:
                    self.rfile.read(length)
                self._answer()

            def _answer(self) -> None:
                server.requests.append((self.command, self.path, dict(self.headers)))
                try:
                    server.answer(self, server)
                except OSError:
                    pass  # the client hung up: what a refusal looks like from here

            def log_message(self, *args) -> None:
                """Quiet."""

        return Handler


def write_body(handler: BaseHTTPRequestHandler, server: HostileServer, total: int) -> None:
    """`total` bytes of zeros, a piece at a time."""
    while server.sent < total and not server.stopping.is_set():
        handler.wfile.write(PIECE)
        server.sent += len(PIECE)
    handler.wfile.flush()


def endless_body(total: int, content_type: str) -> Answer:
    """An answer with no length that goes on for `total` bytes (as good as endless)."""

    def answer(handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Connection", "close")
        handler.end_headers()
        write_body(handler, server, total)
        server.done.set()

    return answer


def never_ending_frame(total: int) -> Answer:
    """An MJPEG stream whose one frame starts and, after `total` bytes, still has not
    ended; the connection then stays open until the server stops."""

    def answer(handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        handler.end_headers()
        handler.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\n\r\n\xff\xd8")
        write_body(handler, server, total)
        server.done.set()
        server.stopping.wait(60)

    return answer


def redirect_to(location: str, status: int = 307) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        handler.send_response(status)
        handler.send_header("Location", location)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def status(code: int) -> Answer:
    def answer(handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        handler.send_response(code)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    return answer


def picture(data: bytes, content_type: str = "image/jpeg") -> Answer:
    def answer(handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    return answer


def jpeg_declaring(width: int, height: int) -> bytes:
    """A small JPEG whose header says it is `width` x `height` pixels: a few hundred
    bytes that would decode to gigabytes."""
    with io.BytesIO() as out:
        Image.new("RGB", (8, 8), (200, 100, 0)).save(out, format="JPEG")
        data = bytearray(out.getvalue())
    sof = data.index(b"\xff\xc0")  # start of frame: length, precision, height, width
    data[sof + 5 : sof + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def closed_port() -> int:
    """A port on 127.0.0.1 where nothing listens: a connection is refused at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SilentHost:
    """A port that takes connections (the kernel completes them) and never answers."""

    def __init__(self) -> None:
        self.socket = socket.socket()
        self.socket.bind(("127.0.0.1", 0))
        self.socket.listen(16)
        self.port = self.socket.getsockname()[1]

    def close(self) -> None:
        self.socket.close()


def mjpeg(frames: list[bytes]) -> Answer:
    """An MJPEG stream of `frames`, then an open connection until the server stops."""

    def answer(handler: BaseHTTPRequestHandler, server: HostileServer) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
        handler.end_headers()
        for data in frames:
            handler.wfile.write(b"--frame\r\nContent-Type: image/jpeg\r\n\r\n" + data + b"\r\n")
        handler.wfile.flush()
        server.done.set()
        server.stopping.wait(60)

    return answer
