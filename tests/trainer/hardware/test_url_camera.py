"""A real robot's cameras from their URLs: an MJPEG stream's latest frame, a snapshot
endpoint's frame per read, and a camera that stops or is not there reported by name."""

import pytest

from tests.processes import wait_until
from tests.trainer.hardware.fake_camera import FakeCamera
from trainer.hardware.url_camera import CameraLost, UrlCamera

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
    with pytest.raises(CameraLost, match=r"camera side: http://.*/nothing: HTTPError"):
        missing.read()
    camera.stop()
    gone = UrlCamera("front", camera.url("snapshot"), timeout_s=0.5)
    with pytest.raises(CameraLost, match="ConnectionError"):
        gone.read()
