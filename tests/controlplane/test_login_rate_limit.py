"""Logins are rate-limited per username and address (django-axes): after the allowed
failures the pair is locked out, with a page that says so, until the cool-off ends."""

from datetime import timedelta

import pytest
import time_machine
from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.utils import timezone

pytestmark = pytest.mark.django_db


@pytest.fixture
def ada():
    return get_user_model().objects.create_user("ada", password="the-right-one")


def attempt(client, password: str, username: str = "ada", path: str = "/login/"):
    return client.post(path, {"username": username, "password": password})


def fail_until_locked(client, settings, username: str = "ada", path: str = "/login/") -> None:
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "wrong", username, path).status_code == 200
    assert attempt(client, "wrong", username, path).status_code == 429


def test_it_locks_a_username_out_after_the_failure_limit(client, settings, ada):
    assert settings.AXES_FAILURE_LIMIT == 5
    fail_until_locked(client, settings)
    refused = attempt(client, "the-right-one")  # even the right password, for now
    assert refused.status_code == 429
    page = refused.content.decode()
    assert "Too many failed attempts to log in as “ada” from your address" in page
    assert "try again in 15 minutes" in page
    assert "_auth_user_id" not in client.session


def test_other_users_can_still_log_in_from_the_same_address(client, settings, ada):
    get_user_model().objects.create_user("bob", password="bobs-password")
    fail_until_locked(client, settings)
    assert attempt(client, "bobs-password", username="bob").status_code == 302


def test_a_success_before_the_limit_starts_the_count_again(client, settings, ada):
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        attempt(client, "wrong")
    assert attempt(client, "the-right-one").status_code == 302
    client.post("/logout/")
    for _ in range(settings.AXES_FAILURE_LIMIT - 1):
        assert attempt(client, "wrong").status_code == 200


def test_the_lock_ends_after_the_cool_off(client, settings, ada):
    settings.AXES_COOLOFF_TIME = timedelta(minutes=15)
    with time_machine.travel(timezone.now(), tick=False) as clock:
        fail_until_locked(client, settings)  # the last attempt is refused as locked out
        clock.shift(timedelta(minutes=15, seconds=1))
        assert attempt(client, "the-right-one").status_code == 302


def test_the_admins_login_is_limited_too(client, settings):
    get_user_model().objects.create_superuser("root", password="roots-password")
    fail_until_locked(client, settings, username="root", path="/admin/login/")
    assert attempt(client, "roots-password", "root", "/admin/login/").status_code == 429


def test_axes_reset_lifts_the_lock(client, settings, ada):
    fail_until_locked(client, settings)
    call_command("axes_reset", verbosity=0)
    assert attempt(client, "the-right-one").status_code == 302


def test_behind_a_proxy_each_client_is_counted_by_its_own_address(client, settings, ada):
    """All logins arrive from the proxy's address; the lock falls on the address the
    proxy saw, so failing on purpose locks out the one who fails, not everyone."""
    settings.ARMATURE_PROXY_COUNT = 1
    proxy = {"REMOTE_ADDR": "10.0.0.2"}

    def from_(address: str, password: str):
        # What the client claimed, then the address the proxy saw.
        forwarded = f"203.0.113.9, {address}"
        credentials = {"username": "ada", "password": password}
        return client.post("/login/", credentials, HTTP_X_FORWARDED_FOR=forwarded, **proxy)

    for _ in range(settings.AXES_FAILURE_LIMIT):
        from_("198.51.100.7", "wrong")
    assert from_("198.51.100.7", "the-right-one").status_code == 429
    assert from_("198.51.100.8", "the-right-one").status_code == 302  # another client


def test_without_a_proxy_a_forwarded_header_is_ignored(client, settings, ada):
    settings.ARMATURE_PROXY_COUNT = 0
    for index in range(settings.AXES_FAILURE_LIMIT):
        client.post("/login/", {"username": "ada", "password": "wrong"},
                    HTTP_X_FORWARDED_FOR=f"198.51.100.{index}")  # fmt: skip
    refused = client.post("/login/", {"username": "ada", "password": "the-right-one"},
                          HTTP_X_FORWARDED_FOR="198.51.100.99")  # fmt: skip
    assert refused.status_code == 429
