"""In Chromium: create an API token on the Settings page, copy it, use it, revoke it
(after confirming), and see it refused."""

import urllib.error
import urllib.request

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

pytestmark = pytest.mark.django_db(transaction=True)


def api_status(url: str, token: str) -> int:
    request = urllib.request.Request(
        f"{url}/api/v1/clusters", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status
    except urllib.error.HTTPError as error:
        return error.code


def test_it_creates_copies_and_revokes_a_token(browser, stack_factory):
    url = stack_factory().start_web()
    get_user_model().objects.create_user("tess", password="pw-for-tests")
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    page.goto(url + "/login/")
    page.get_by_label("Username").fill("tess")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    page.get_by_role("navigation").get_by_role("link", name="Settings").click()
    expect(page.get_by_role("heading", name="Settings", exact=True)).to_be_visible()
    expect(page.locator("#role")).to_have_text("viewer")

    page.get_by_label("Name").fill("laptop")
    page.get_by_label("Your password").fill("not-mine")
    page.get_by_label("Your password").press("Enter")
    expect(page.locator("#token-create")).to_contain_text("That is not your password.")
    page.get_by_label("Your password").fill("pw-for-tests")
    page.get_by_label("Your password").press("Enter")
    token = page.locator("#new-token").inner_text()
    assert token.startswith("arm_")
    page.get_by_role("button", name="Copy").click()
    expect(page.locator("[data-copy-status]")).to_have_text("Copied.")
    assert page.evaluate("navigator.clipboard.readText()") == token
    assert api_status(url, token) == 200
    # The page's address is the settings page's: a reload sends no form again.
    assert page.url == url + "/settings/"
    page.reload()
    expect(page.locator("#new-token")).to_have_count(0)
    expect(page.locator("#token-list tbody tr", has_text="laptop")).to_have_count(1)

    row = page.locator("#token-list tbody tr", has_text="laptop")
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.get_by_role("button", name="Revoke").click()
    expect(row).to_contain_text("active")
    assert api_status(url, token) == 200

    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_role("button", name="Revoke").click()
    expect(page.get_by_role("status")).to_contain_text("Token “laptop”")
    expect(page.locator("#token-list tbody tr", has_text="laptop")).to_contain_text("revoked")
    assert token not in page.content()
    assert api_status(url, token) == 401
    context.close()
