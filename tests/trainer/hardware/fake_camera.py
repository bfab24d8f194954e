"""A stand-in for a robot's IP camera: `/stream` serves MJPEG
(`multipart/x-mixed-replace`, as IP cameras and ROS's web_video_server do) and
`/snapshot` one JPEG per GET. Frame n is a flat colour with n in its red channel, so a
test can tell frames apart, or with `red` when a test sets it (a scene to judge);
`freeze` stops the stream's frames (the connection stays)."""

from __future__ import annotations

import io
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
from PIL import Image

BOUNDARY = "frame"


def frame(index: int, size: int = 32) -> bytes:
    picture = np.zeros((size, size, 3), dtype=np.uint8)
    picture[..., 0] = index % 256
    picture[..., 1] = 100
    with io.BytesIO() as out:
        Image.fromarray(picture).save(out, format="JPEG", quality=95)
        return out.getvalue()


class FakeCamera:
    def __init__(self, fps: float = 30.0) -> None:
        self.fps = fps
        self.count = 0
        self.red: int | None = None
        self.frozen = threading.Event()
        self._stopping = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/{path}"

    def shown(self) -> int:
        """The red value of the frame served now."""
        return self.count if self.red is None else self.red

    def stop(self) -> None:
        self._stopping.set()
        self._server.shutdown()
        self._server.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        camera = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                if self.path == "/snapshot":
                    camera.count += 1
                    self._send(frame(camera.shown()))
                elif self.path == "/stream":
                    self._stream()
                else:
                    self.send_error(404)

            def _send(self, data: bytes) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "image/jpeg")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self) -> None:
                self.send_response(200)
                self.send_header("Content-Type", f"multipart/x-mixed-replace; boundary={BOUNDARY}")
                self.end_headers()
                while not camera._stopping.is_set():
                    if not camera.frozen.is_set():
                        camera.count += 1
                        data = frame(camera.shown())
                        part = (f"--{BOUNDARY}\r\nContent-Type: image/jpeg\r\n"
                                f"Content-Length: {len(data)}\r\n\r\n").encode()  # fmt: skip
                        try:
                            self.wfile.write(part + data + b"\r\n")
                            self.wfile.flush()
                        except OSError:
                            return
                    time.sleep(1.0 / camera.fps)

            def log_message(self, *args) -> None:
                """Quiet."""

        return Handler
