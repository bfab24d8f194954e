"""The Settings page: the user's role, their API tokens, create (with the password again,
shown once, within the longest lifetime) and revoke; a password change ends them all."""

import io
import re
from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from django.utils import timezone

from controlplane.api import tokens
from controlplane.api.models import ApiToken

pytestmark = pytest.mark.django_db

PASSWORD = "pw-ada-123"
TOKEN = re.compile(r'<code id="new-token">(arm_[a-z0-9]+_[A-Za-z0-9]+)</code>')


ONCE = re.compile(r'name="once" value="([^"]+)"')


def post_form(client: Client, data: dict):
    """The token form sent as the settings page draws it (with its one-use field)."""
    once = ONCE.search(client.get("/settings/").content.decode()).group(1)
    return client.post("/settings/tokens", {**data, "once": once})


@pytest.fixture
def user():
    ada = get_user_model().objects.create_user("ada", password=PASSWORD)
    ada.groups.add(Group.objects.get_or_create(name="operator")[0])
    return ada


@pytest.fixture
def browser_client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_it_needs_a_login():
    response = Client().get("/settings/")
    assert response.status_code == 302
    assert response["Location"].startswith("/login/")


def test_it_shows_the_role_and_the_nav_link(browser_client):
    page = browser_client.get("/settings/").content.decode()
    assert '<span class="tag" id="role">operator</span>' in page
    assert 'href="/settings/" aria-current="page">Settings</a>' in page
    assert "No tokens yet." in page


def test_it_creates_a_token_shown_once_that_works(browser_client, user):
    created = post_form(
        browser_client, {"name": "GitHub CI", "expires": "365", "password": PASSWORD}
    )
    assert created.status_code == 200
    assert "no-store" in created["Cache-Control"]
    page = created.content.decode()
    plain = TOKEN.search(page).group(1)
    assert "it will not be shown again" in page
    assert 'data-copy-target="new-token"' in page
    token = ApiToken.objects.get(user=user)
    assert token.name == "GitHub CI"
    assert plain.startswith(f"arm_{token.prefix}_")
    assert tokens.authenticate_token(plain).user == user

    again = browser_client.get("/settings/").content.decode()
    assert plain not in again
    assert f"arm_{token.prefix}_…" in again
    assert "GitHub CI" in again


def test_a_token_needs_a_name(browser_client):
    response = post_form(browser_client, {"name": "", "expires": "30", "password": PASSWORD})
    assert response.status_code == 400
    assert "This field is required." in response.content.decode()
    assert not ApiToken.objects.exists()


def test_it_revokes_a_token_after_confirmation(browser_client, user):
    token, plain = tokens.create_token(user, "old")
    page = browser_client.get("/settings/").content.decode()
    assert f'action="/settings/tokens/{token.pk}/revoke"' in page
    assert 'data-confirm="Revoke the token “old”?' in page
    response = browser_client.post(f"/settings/tokens/{token.pk}/revoke", follow=True)
    assert response.redirect_chain == [("/settings/", 302)]
    page = response.content.decode()
    assert f"Token “old” (arm_{token.prefix}) revoked." in page
    assert "revoked " in page
    assert ApiToken.objects.get(pk=token.pk).revoked_at is not None
    with pytest.raises(tokens.InvalidToken):
        tokens.authenticate_token(plain)


def test_revoking_needs_post(browser_client, user):
    token, _ = tokens.create_token(user, "ci")
    assert browser_client.get(f"/settings/tokens/{token.pk}/revoke").status_code == 405
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


def test_it_neither_lists_nor_revokes_someone_elses_token(browser_client):
    other = get_user_model().objects.create_user("bob")
    token, _ = tokens.create_token(other, "bobs-token")
    assert "bobs-token" not in browser_client.get("/settings/").content.decode()
    assert browser_client.post(f"/settings/tokens/{token.pk}/revoke").status_code == 404
    assert ApiToken.objects.get(pk=token.pk).revoked_at is None


@pytest.mark.parametrize(("choice", "days"), [("7", 7), ("30", 30), ("90", 90), ("365", 365)])
def test_a_token_can_be_given_an_expiry(browser_client, user, choice, days):
    before = timezone.now()
    created = post_form(browser_client, {"name": "CI", "expires": choice, "password": PASSWORD})
    assert created.status_code == 200
    token = ApiToken.objects.get(user=user)
    lifetime = timedelta(days=days)
    assert before + lifetime <= token.expires_at <= timezone.now() + lifetime
    assert token.expires_at.strftime("%Y-%m-%d %H:%M") in created.content.decode()


def test_the_form_offers_expiries_with_90_days_first_chosen(browser_client):
    page = browser_client.get("/settings/").content.decode()
    assert '<select name="expires"' in page
    assert '<option value="90" selected>in 90 days</option>' in page
    assert 'value="never"' not in page  # the longest lifetime is the last choice
    assert '<option value="365">in a year</option>' in page


def test_an_unknown_expiry_is_refused(browser_client):
    response = post_form(browser_client, {"name": "CI", "expires": "forever", "password": PASSWORD})
    assert response.status_code == 400
    assert not ApiToken.objects.exists()


def test_the_list_shows_last_use_and_expiry(browser_client, user):
    used, plain = tokens.create_token(user, "used", expires_at=timezone.now() + timedelta(days=3))
    tokens.authenticate_token(plain)
    tokens.create_token(user, "forever")
    gone, _ = tokens.create_token(user, "gone", expires_at=timezone.now() - timedelta(days=1))
    page = browser_client.get("/settings/").content.decode()
    assert "<th>Last used</th><th>Expires</th>" in page
    row = page[page.index(f'data-token="{used.prefix}"') :].split("</tr>")[0]
    used = ApiToken.objects.get(pk=used.pk)
    assert used.last_used_at.strftime("%Y-%m-%d %H:%M") in row
    assert used.expires_at.strftime("%Y-%m-%d %H:%M") in row and "active" in row
    expired = page[page.index(f'data-token="{gone.prefix}"') :].split("</tr>")[0]
    assert "expired" in expired and "Revoke" not in expired


def test_creating_a_token_asks_for_the_password_again(browser_client):
    for password in ("", "not-it"):
        refused = post_form(browser_client, {"name": "CI", "expires": "30", "password": password})
        assert refused.status_code == 400
    assert "That is not your password." in refused.content.decode()
    assert not ApiToken.objects.exists()


@pytest.mark.parametrize("who", ["the user", "an admin"])
def test_a_password_change_ends_every_token_made_before_it(user, who):
    _, plain = tokens.create_token(user, "ci")
    assert tokens.authenticate_token(plain).user == user
    changed = get_user_model().objects.get(pk=user.pk)  # as an admin's request would
    changed.set_password("a-new-password" if who == "the user" else PASSWORD)  # even the same
    changed.save()
    with pytest.raises(tokens.InvalidToken, match="made before its user's password changed"):
        tokens.authenticate_token(plain)
    _, fresh = tokens.create_token(changed, "ci again")
    assert tokens.authenticate_token(fresh).user == changed


def test_reset_admin_password_ends_the_admins_tokens(db):
    from django.core.management import call_command

    admin = get_user_model().objects.create_superuser("admin", password="old-admin-pw")
    _, plain = tokens.create_token(admin, "ci")
    call_command("reset_admin_password", stdout=io.StringIO())
    with pytest.raises(tokens.InvalidToken, match="password changed"):
        tokens.authenticate_token(plain)


def test_no_token_outlives_the_longest_lifetime(user, settings):
    settings.ARMATURE_TOKEN_MAX_DAYS = 30
    forever, plain = tokens.create_token(user, "made with no expiry")
    ApiToken.objects.filter(pk=forever.pk).update(created_at=timezone.now() - timedelta(days=31))
    with pytest.raises(tokens.InvalidToken, match="expired on"):
        tokens.authenticate_token(plain)
    client = Client()
    client.force_login(user)
    page = client.get("/settings/").content.decode()
    assert '<option value="30" selected>in 30 days</option>' in page
    assert 'value="90"' not in page and 'value="365"' not in page
    refused = post_form(client, {"name": "CI", "expires": "365",
                                               "password": PASSWORD})  # fmt: skip
    assert refused.status_code == 400


def test_a_sent_form_makes_one_token_however_often_it_is_sent_again(browser_client, user):
    once = ONCE.search(browser_client.get("/settings/").content.decode()).group(1)
    form = {"name": "CI", "expires": "30", "password": PASSWORD, "once": once}
    assert TOKEN.search(browser_client.post("/settings/tokens", form).content.decode())
    again = browser_client.post("/settings/tokens", form)  # a reload of the page shown
    assert again.status_code == 400 and "This form was sent already" in again.content.decode()
    assert ApiToken.objects.filter(user=user).count() == 1
    # A refused form (a wrong password) keeps its use for the next try.
    once = ONCE.search(browser_client.get("/settings/").content.decode()).group(1)
    wrong = {**form, "once": once, "password": "not-it"}
    assert browser_client.post("/settings/tokens", wrong).status_code == 400
    assert TOKEN.search(browser_client.post("/settings/tokens", {**wrong, "password": PASSWORD})
                        .content.decode())  # fmt: skip
    assert ApiToken.objects.filter(user=user).count() == 2
