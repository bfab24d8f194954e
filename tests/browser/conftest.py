"""Fixtures of the browser tests."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from tests.trainer.hardware.fake_camera import FakeCamera
from tests.trainer.hardware.fake_serl_server import FakeSerlServer


@pytest.fixture
def arm():
    """A fake SERL robot server and a fake camera (an MJPEG stream and a snapshot)."""
    server, camera = FakeSerlServer().start(), FakeCamera(fps=15)
    yield server, camera
    server.stop()
    camera.stop()


@pytest.fixture
def operator_page(browser, web):
    """Chromium at 1440×1000, logged in as the operator rita; fails the test on a page
    error."""
    user = get_user_model().objects.create_user("rita", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(web.url + "/login/")
    page.get_by_label("Username").fill("rita")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    page.web = web
    yield page
    page.close()
    assert not errors, errors
