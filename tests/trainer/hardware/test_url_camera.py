"""A real robot's cameras from their URLs: an MJPEG stream's latest frame, a snapshot
endpoint's frame per read, and a camera that stops or is not there reported by name.
What a camera's address leads to is not trusted: only http(s), no redirect, a picture
read up to a cap of bytes and of pixels, an MJPEG frame that never ends dropped in
bounded memory, a closed port and a silent host read the same, and a password in the
URL never written into a message."""

import base64
import traceback
import tracemalloc

import pytest

from tests.processes import wait_until
from tests.trainer.hardware.fake_camera import FakeCamera, frame
from tests.trainer.hardware.hostile_server import (
    HostileServer,
    SilentHost,
    closed_port,
    endless_body,
    jpeg_declaring,
    mjpeg,
    never_ending_frame,
    picture,
    redirect_to,
    status,
)
from trainer.hardware.url_camera import MAX_PICTURE_BYTES, CameraLost, MjpegFrames, UrlCamera

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def camera():
    fake = FakeCamera(fps=30.0)
    yield fake
    fake.stop()


def red(picture) -> int:
    return int(picture[..., 0].mean().round())


def test_an_mjpeg_streams_latest_frame_is_read_and_a_frozen_stream_is_reported(camera):
    wrist = UrlCamera("wrist", camera.url("stream"), timeout_s=1.0, stale_s=0.5)
    try:
        first = wrist.read()  # opening waits for the stream's first frame
        assert first.shape == (32, 32, 3) and first.dtype.name == "uint8"
        wait_until(lambda: red(wrist.read()) > red(first) + 3, 10, "newer frames")
        assert abs(red(wrist.read()) - camera.count % 256) <= 3  # the latest, within JPEG's error
        camera.frozen.set()
        wait_until(lambda: stale(wrist), 10, "the stream to go stale")
        with pytest.raises(CameraLost, match=r"camera wrist: http://.*/stream: last frame"):
            wrist.read()
        camera.frozen.clear()
        wait_until(lambda: not stale(wrist), 10, "frames again")
    finally:
        wrist.close()


def stale(camera: UrlCamera) -> bool:
    try:
        camera.read()
    except CameraLost:
        return True
    return False


def test_a_snapshot_endpoint_gives_a_new_frame_per_read(camera):
    front = UrlCamera("front", camera.url("snapshot"))
    try:
        counts = [red(front.read()) for _ in range(3)]
        assert counts == pytest.approx([1, 2, 3], abs=3) and counts[0] < counts[2]
    finally:
        front.close()


def test_a_camera_that_is_not_there_is_named(camera):
    missing = UrlCamera("side", camera.url("nothing"))
    with pytest.raises(CameraLost, match=r"camera side: http://.*/nothing answered HTTP 404"):
        missing.read()
    camera.stop()
    gone = UrlCamera("front", camera.url("snapshot"), timeout_s=0.5)
    with pytest.raises(CameraLost, match=r"/snapshot did not answer within 0\.5 s"):
        gone.read()


@pytest.mark.parametrize(
    "url", ["file:///etc/passwd", "ftp://127.0.0.1/x.jpg", "gopher://127.0.0.1:70/",
            "http://127.0.0.1/snapshot#frame", "http:///snapshot", "127.0.0.1/snapshot"],
)  # fmt: skip
def test_only_an_http_url_without_fragment_is_a_camera(url):
    with pytest.raises(ValueError, match="camera URL"):
        UrlCamera("wrist", url)


def test_a_redirect_is_never_followed(camera):
    elsewhere = HostileServer(redirect_to(camera.url("snapshot"), 302))
    front = UrlCamera("front", elsewhere.url("snapshot"))
    try:
        with pytest.raises(CameraLost, match=r"redirect \(HTTP 302\).*never followed"):
            front.read()
        assert camera.count == 0  # the other port was never reached
    finally:
        front.close()
        elsewhere.stop()


def test_a_closed_port_and_a_silent_host_read_the_same():
    silent, closed = SilentHost(), closed_port()
    try:
        messages = {}
        for port in (silent.port, closed):
            with pytest.raises(CameraLost) as caught:
                UrlCamera("side", f"http://127.0.0.1:{port}/snapshot", timeout_s=0.5).read()
            messages[port] = str(caught.value).replace(str(port), "PORT")
            assert caught.value.__cause__ is None and caught.value.__suppress_context__
        assert (
            messages[silent.port]
            == messages[closed]
            == ("camera side: http://127.0.0.1:PORT/snapshot did not answer within 0.5 s")
        )
    finally:
        silent.close()


def test_an_endless_snapshot_is_refused_at_the_cap_in_bounded_memory():
    flood = HostileServer(endless_body(4 * MAX_PICTURE_BYTES, "image/jpeg"))
    tracemalloc.start()
    try:
        front = UrlCamera("front", flood.url("snapshot"))
        with pytest.raises(CameraLost, match=r"front: http://.*/snapshot sent more than 8 MiB"):
            front.read()
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
        flood.stop()
    assert peak < 2 * MAX_PICTURE_BYTES, f"{peak} bytes held at once"


def test_an_mjpeg_frame_that_never_ends_is_dropped_in_bounded_memory():
    flood = HostileServer(never_ending_frame(3 * MAX_PICTURE_BYTES))
    tracemalloc.start()
    wrist = UrlCamera("wrist", flood.url("stream"), timeout_s=2.0, stale_s=60.0)
    try:
        with pytest.raises(CameraLost, match="no frame yet"):
            wrist.read()
        wait_until(flood.done.is_set, 30, "the server to write its frame's bytes")
        wait_until(lambda: "longer than 8 MiB" in wrist.problem, 30, "the frame to be dropped")
        peak = tracemalloc.get_traced_memory()[1]
        with pytest.raises(CameraLost, match=r"no frame yet \(a frame longer than 8 MiB"):
            wrist.read()
    finally:
        tracemalloc.stop()
        wrist.close()
        flood.stop()
    assert peak < 2 * MAX_PICTURE_BYTES, f"{peak} bytes held at once"


@pytest.mark.parametrize("size", [(60000, 60000), (5000, 5000), (4097, 4096)])
def test_a_picture_declaring_more_pixels_than_the_cap_is_refused_undecoded(size):
    bomb = HostileServer(picture(jpeg_declaring(*size)))
    front = UrlCamera("front", bomb.url("snapshot"))
    try:
        with pytest.raises(CameraLost, match=rf"{size[0]}x{size[1]} pixels, more than 4096x4096"):
            front.read()
    finally:
        front.close()
        bomb.stop()


def test_a_stream_reports_a_frame_of_too_many_pixels_and_goes_on_past_it():
    bombs = HostileServer(mjpeg([frame(10), jpeg_declaring(60000, 60000)]))
    stream = HostileServer(mjpeg([frame(10), jpeg_declaring(60000, 60000), frame(200)]))
    cameras = [UrlCamera(name, server.url("stream"), stale_s=60.0)
               for name, server in (("wrist", bombs), ("front", stream))]  # fmt: skip
    try:
        assert red(cameras[0].read()) == pytest.approx(10, abs=3)
        # Reading as it arrives, the front stream may be past the refused frame already:
        # its latest is the frame before it or the one after, never the refused one.
        assert red(cameras[1].read()) in (pytest.approx(10, abs=3), pytest.approx(200, abs=3))
        wait_until(lambda: "60000x60000 pixels" in cameras[0].problem, 10, "the refusal")
        assert red(cameras[0].read()) < 20  # the frame before stays the latest
        wait_until(lambda: red(cameras[1].read()) > 150, 10, "the frame after the refused one")
    finally:
        for camera in cameras:
            camera.close()
        bombs.stop()
        stream.stop()


def test_a_password_in_the_url_is_sent_but_never_written():
    recorder = HostileServer(status(401))
    front = UrlCamera("front", f"http://cam:s3cret@127.0.0.1:{recorder.port}/snapshot")
    try:
        with pytest.raises(CameraLost, match="HTTP 401") as answered:
            front.read()
        (_, path, headers) = recorder.requests[0]
        assert path == "/snapshot"
        assert headers["Authorization"] == "Basic " + base64.b64encode(b"cam:s3cret").decode()
        recorder.stop()
        with pytest.raises(CameraLost, match="did not answer") as unanswered:
            front.read()
        for caught in (answered, unanswered):
            written = "".join(traceback.format_exception(caught.value)) + repr(vars(front))
            assert "cam:***@127.0.0.1" in written and "s3cret" not in written
    finally:
        front.close()
        recorder.stop()


def test_frames_are_cut_the_same_however_the_stream_is_split_and_never_rescanned():
    pictures = [frame(index) for index in (10, 60, 110)]
    stream = b"".join(b"--frame\r\n\r\n" + data + b"\r\n" for data in pictures)
    for piece in (1, 2, 3, 1000, len(stream)):
        frames, cut = MjpegFrames(limit=4096), []
        for at in range(0, len(stream), piece):
            cut += frames.feed(stream[at : at + piece])
            # What is held was searched already: the next chunk's search starts at its end.
            assert frames.scanned == len(frames.buffer) <= 4096
        assert cut == pictures and frames.dropped == 0
    frames = MjpegFrames(limit=4096)
    assert frames.feed(b"\xff\xd8" + b"\x00" * 5000) == [] and frames.dropped == 1
    assert len(frames.buffer) <= 1
    assert frames.feed(b"\xff\xd9" + pictures[0]) == [pictures[0]]  # the end of the dropped one
