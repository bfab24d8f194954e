"""Fixtures of the browser tests."""

import pytest

from tests.trainer.hardware.fake_camera import FakeCamera
from tests.trainer.hardware.fake_serl_server import FakeSerlServer


@pytest.fixture
def arm():
    """A fake SERL robot server and a fake camera (an MJPEG stream and a snapshot)."""
    server, camera = FakeSerlServer().start(), FakeCamera(fps=15)
    yield server, camera
    server.stop()
    camera.stop()
