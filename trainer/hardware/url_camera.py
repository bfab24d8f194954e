"""A real robot's camera behind a URL, as IP cameras and ROS image bridges
(web_video_server) serve them: an MJPEG stream (`multipart/x-mixed-replace`, one JPEG
after another), read by a thread that keeps the latest frame, or a snapshot endpoint
(one JPEG or PNG per GET), read when a frame is asked for.

Every request has a deadline, and a frame older than `stale_s` is no frame: `read`
raises `CameraLost` naming the URL, so a camera that stops is reported, never shown
frozen.
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import requests
import urllib3
from PIL import Image

CHUNK_BYTES = 64 * 1024
JPEG_START, JPEG_END = b"\xff\xd8", b"\xff\xd9"


class CameraLost(RuntimeError):
    """No fresh frame from a camera's URL."""


def decode_picture(data: bytes) -> np.ndarray:
    """A JPEG or PNG as `[H, W, 3]` uint8 RGB."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(image.convert("RGB"))


class UrlCamera:
    def __init__(self, name: str, url: str, timeout_s: float = 1.0, stale_s: float = 2.0) -> None:
        self.name, self.url, self.timeout_s, self.stale_s = name, url, timeout_s, stale_s
        self.session = requests.Session()
        self.latest: tuple[float, np.ndarray] | None = None  # (time.monotonic, frame)
        self.problem = ""  # why the stream has no fresh frame, when it has none
        self.kind: str | None = None  # "stream" or "snapshot", once asked
        self._closed = threading.Event()
        self._first_frame = threading.Event()

    def read(self) -> np.ndarray:
        """The latest frame of a stream, or a snapshot taken now."""
        if self.kind is None:
            first = self._open()
            if first is not None:
                return first
        if self.kind == "snapshot":
            return decode_picture(self._get(stream=False).content)
        latest = self.latest
        now = time.monotonic()
        if latest is None or now - latest[0] > self.stale_s:
            age = "no frame yet" if latest is None else f"last frame {now - latest[0]:.1f} s ago"
            raise CameraLost(f"camera {self.name}: {self.url}: {age} {self.problem}".rstrip())
        return latest[1]

    def _open(self) -> np.ndarray | None:
        """Ask once what the URL serves: a stream gets a reader thread (and a moment,
        up to the timeout, for its first frame); a snapshot is the first frame."""
        response = self._get(stream=True)
        if response.headers.get("Content-Type", "").startswith("multipart/"):
            self.kind = "stream"
            threading.Thread(
                target=self._follow, args=(response,), name=f"camera-{self.name}", daemon=True
            ).start()
            self._first_frame.wait(self.timeout_s)
            return None
        self.kind = "snapshot"
        return decode_picture(response.content)

    def _get(self, stream: bool) -> requests.Response:
        try:
            response = self.session.get(self.url, timeout=self.timeout_s, stream=stream)
            response.raise_for_status()
        except requests.RequestException as error:
            raise CameraLost(f"camera {self.name}: {self.url}: {type(error).__name__}") from error
        return response

    def _follow(self, response: requests.Response) -> None:
        """Read JPEGs off the stream until closed; reconnect when it breaks."""
        while not self._closed.is_set():
            try:
                self._read_stream(response)
                self.problem = "(the stream ended)"
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as error:
                self.problem = f"({type(error).__name__})"
            if self._closed.wait(min(self.stale_s, 0.5)):
                return
            try:
                response = self._get(stream=True)
            except CameraLost:
                continue

    def _read_stream(self, response: requests.Response) -> None:
        buffer = b""
        # read1: what has arrived, up to a chunk (read would wait for a whole chunk).
        while chunk := response.raw.read1(CHUNK_BYTES):
            if self._closed.is_set():
                return
            buffer += chunk
            while True:
                start = buffer.find(JPEG_START)
                end = buffer.find(JPEG_END, start + 2) if start >= 0 else -1
                if end < 0:
                    buffer = buffer[start:] if start >= 0 else b""
                    break
                jpeg, buffer = buffer[start : end + 2], buffer[end + 2 :]
                try:
                    self.latest = (time.monotonic(), decode_picture(jpeg))
                    self.problem = ""
                    self._first_frame.set()
                except OSError:
                    self.problem = "(a frame that is not a JPEG)"

    def close(self) -> None:
        self._closed.set()
        self.session.close()
