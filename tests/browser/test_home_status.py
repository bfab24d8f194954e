"""In Chromium: log in and watch the live status panel turn green."""

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

pytestmark = pytest.mark.django_db(transaction=True)

COMPONENTS = ["database", "broker", "worker", "channel_layer", "ray"]


@pytest.fixture
def live_stack(stack_factory, ray_head):
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    return stack


def test_it_logs_in_and_sees_every_component_up(browser, live_stack):
    get_user_model().objects.create_user("linus", password="pw-for-tests")
    page = browser.new_page()
    page.goto(live_stack.url + "/")
    expect(page).to_have_url(live_stack.url + "/login/?next=/")
    page.get_by_label("Username").fill("linus")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    status = page.locator("section", has=page.locator("#status-panel"))
    expect(status.locator(".live-dot.on")).to_be_visible(timeout=15_000)
    for component in COMPONENTS:
        row = page.locator(f'#status-panel tr[data-component="{component}"]')
        expect(row).to_have_attribute("data-state", "up", timeout=60_000)
        expect(row.locator(".badge.up")).to_have_text("up")
    expect(page.locator('tr[data-component="ray"]')).to_contain_text("1 node, 2 CPUs, 0 GPUs")
    page.screenshot(path=str(live_stack.log_dir / "home.png"), full_page=True)
    for link in ["Runs", "Experiments", "Cluster", "Robots", "Console", "API docs"]:
        expect(page.get_by_role("navigation").get_by_role("link", name=link)).to_be_visible()
    page.close()
