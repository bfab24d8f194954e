"""A real robot's camera behind a URL, as IP cameras and ROS image bridges
(web_video_server) serve them: an MJPEG stream (`multipart/x-mixed-replace`, one JPEG
after another), read by a thread that keeps the latest frame, or a snapshot endpoint
(one JPEG or PNG per GET), read when a frame is asked for.

Every request has a deadline, and a frame older than `stale_s` is no frame: `read`
raises `CameraLost` naming the URL, so a camera that stops is reported, never shown
frozen.

What the URL leads to is not trusted. The URL is http(s) without a fragment
(trainer.config.addresses); a redirect is never followed (trainer.hardware.bounded_http);
a snapshot is read up to `MAX_PICTURE_BYTES`; a stream's frame is held up to as many
bytes, and one that starts and does not end within them is dropped; a picture is a
JPEG or a PNG, and one whose header declares more than `MAX_PIXELS` is refused before
it is decoded. A stream's bytes are scanned once as they arrive, so an endless or
hostile stream costs time in proportion to its length and bounded memory. A camera
that gets no answer says so, the same whether its port is closed or its host silent,
and its URL is written with any password replaced (`redact_url`).
"""

from __future__ import annotations

import io
import threading
import time

import numpy as np
import requests
import urllib3
from PIL import Image, JpegImagePlugin, PngImagePlugin

from trainer.config.addresses import check_camera_url, redact_url
from trainer.hardware.bounded_http import (
    CHUNK_BYTES,
    MIB,
    NoAnswer,
    RefusedAnswer,
    open_session,
    read_body,
    send,
    size,
)

JPEG_START, JPEG_END = b"\xff\xd8", b"\xff\xd9"
MAX_PICTURE_BYTES = 8 * MIB  # one snapshot or stream frame (a 4096x4096 JPEG fits)
MAX_SIDE = 4096
MAX_PIXELS = MAX_SIDE * MAX_SIDE  # 48 MiB as RGB
# A picture's format by its first bytes, and PIL's reader of it (only these two: no
# other format's decoder is reached from a camera's bytes).
_READERS = (
    (b"\xff\xd8\xff", JpegImagePlugin.JpegImageFile),
    (b"\x89PNG\r\n\x1a\n", PngImagePlugin.PngImageFile),
)


class CameraLost(RuntimeError):
    """No fresh frame from a camera's URL; `reason` is why, without the camera's name."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class PictureRefused(ValueError):
    """Bytes that are not a JPEG or PNG of at most `MAX_PIXELS` pixels."""


def decode_picture(data: bytes) -> np.ndarray:
    """A JPEG or PNG as `[H, W, 3]` uint8 RGB. The size its header declares is read
    first, and a picture of more than `MAX_PIXELS` is refused undecoded."""
    reader = next((reader for magic, reader in _READERS if data.startswith(magic)), None)
    if reader is None:
        raise PictureRefused("a picture that is not a JPEG or PNG")
    try:
        # The format's reader itself, not Image.open: it reads the header only (and
        # leaves the size check to us, where Image.open would raise PIL's own first).
        with reader(io.BytesIO(data)) as image:
            width, height = image.size
            if width * height > MAX_PIXELS:
                raise PictureRefused(
                    f"a picture of {width}x{height} pixels, more than {MAX_SIDE}x{MAX_SIDE}"
                )
            return np.asarray(image.convert("RGB"))
    except PictureRefused:
        raise
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError):
        raise PictureRefused("a picture that is not a JPEG or PNG") from None


class MjpegFrames:
    """The JPEGs of an MJPEG stream, cut out of its bytes as they arrive.

    Only bytes not yet scanned are searched (from one byte back, for a marker split
    between chunks), and a frame is held up to `limit` bytes: one that has not ended by
    then is dropped, and the bytes after it are searched for the next frame's start.
    """

    def __init__(self, limit: int = MAX_PICTURE_BYTES) -> None:
        self.limit = limit
        self.buffer = bytearray()  # a frame from its start, or bytes before any start
        self.in_frame = False
        self.scanned = 0  # the buffer's bytes already searched for the marker sought
        self.dropped = 0  # frames longer than the limit

    def feed(self, chunk: bytes) -> list[bytes]:
        """The frames that `chunk` ends."""
        buffer = self.buffer
        buffer += chunk
        frames = []
        while True:
            if not self.in_frame:
                start = buffer.find(JPEG_START, max(self.scanned - 1, 0))
                if start < 0:
                    del buffer[: max(len(buffer) - 1, 0)]  # the last byte may begin a start
                    self.scanned = len(buffer)
                    return frames
                del buffer[:start]
                self.in_frame, self.scanned = True, len(JPEG_START)
            end = buffer.find(JPEG_END, max(self.scanned - 1, len(JPEG_START)))
            if end < 0 and len(buffer) <= self.limit:
                self.scanned = len(buffer)
                return frames
            if end < 0 or end + len(JPEG_END) > self.limit:
                self.dropped += 1
                cut = len(buffer) - 1 if end < 0 else end + len(JPEG_END)
            else:
                cut = end + len(JPEG_END)
                frames.append(bytes(buffer[:cut]))
            del buffer[:cut]
            self.in_frame, self.scanned = False, 0


class UrlCamera:
    def __init__(self, name: str, url: str, timeout_s: float = 1.0, stale_s: float = 2.0) -> None:
        try:
            check_camera_url(url)
        except ValueError as error:
            raise ValueError(f"camera {name}: {error}") from None
        self.name, self.timeout_s, self.stale_s = name, timeout_s, stale_s
        self.session, self.url = open_session(url)  # the URL without a password
        self.shown_url = redact_url(url)  # what messages name
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
            return self._snapshot(self._get())
        latest = self.latest
        now = time.monotonic()
        if latest is None or now - latest[0] > self.stale_s:
            age = "no frame yet" if latest is None else f"last frame {now - latest[0]:.1f} s ago"
            raise CameraLost(f"camera {self.name}: {self.shown_url}: {age} {self.problem}".rstrip())
        return latest[1]

    def _open(self) -> np.ndarray | None:
        """Ask once what the URL serves: a stream gets a reader thread (and a moment,
        up to the timeout, for its first frame); a snapshot is the first frame."""
        response = self._get()
        if response.headers.get("Content-Type", "").startswith("multipart/"):
            self.kind = "stream"
            threading.Thread(
                target=self._follow, args=(response,), name=f"camera-{self.name}", daemon=True
            ).start()
            self._first_frame.wait(self.timeout_s)
            return None
        self.kind = "snapshot"
        return self._snapshot(response)

    def _get(self) -> requests.Response:
        """The answer's headers; its body is read as it is needed."""
        try:
            return send(self.session, "GET", self.url, self.timeout_s)
        except NoAnswer:
            raise self._lost(f"did not answer within {self.timeout_s} s") from None
        except RefusedAnswer as error:
            raise self._lost(f"answered {error}") from None

    def _snapshot(self, response: requests.Response) -> np.ndarray:
        try:
            return decode_picture(read_body(response, MAX_PICTURE_BYTES, self.timeout_s))
        except NoAnswer:
            raise self._lost(f"did not answer within {self.timeout_s} s") from None
        except (RefusedAnswer, PictureRefused) as error:
            raise self._lost(f"sent {error}") from None

    def _lost(self, why: str) -> CameraLost:
        return CameraLost(f"camera {self.name}: {self.shown_url} {why}", reason=why)

    def _follow(self, response: requests.Response) -> None:
        """Read JPEGs off the stream until closed; reconnect when it breaks."""
        while True:
            try:
                with response:
                    self._read_stream(response)
                self.problem = "(the stream ended)"
            except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
                self.problem = "(the stream stopped)"
            while True:
                if self._closed.wait(min(self.stale_s, 0.5)):
                    return
                try:
                    response = self._get()
                    break
                except CameraLost as error:
                    self.problem = f"({error.reason})"

    def _read_stream(self, response: requests.Response) -> None:
        frames = MjpegFrames()
        # read1: what has arrived, up to a chunk (read would wait for a whole chunk).
        while chunk := response.raw.read1(CHUNK_BYTES, decode_content=False):
            if self._closed.is_set():
                return
            dropped = frames.dropped
            for jpeg in frames.feed(chunk):
                try:
                    self.latest = (time.monotonic(), decode_picture(jpeg))
                    self.problem = ""
                    self._first_frame.set()
                except PictureRefused as error:
                    self.problem = f"({error})"
            if frames.dropped > dropped:
                self.problem = f"(a frame longer than {size(MAX_PICTURE_BYTES)}, dropped)"

    def close(self) -> None:
        self._closed.set()
        self.session.close()
