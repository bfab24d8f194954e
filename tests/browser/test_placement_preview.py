"""In Chromium: edit a placement and watch the grid (or the errors) follow as you type."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from controlplane.experiments.services import create_experiment
from controlplane.inventory.services import import_cluster_yaml

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def logged_in_page(browser, stack_factory):
    stack = stack_factory()
    stack.start_web()
    get_user_model().objects.create_user("ada", password="pw-for-tests")
    import_cluster_yaml("lab", (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text())
    page = browser.new_page()
    page.goto(stack.url + "/login/")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    page.goto(stack.url + "/cluster/lab/placement/")
    yield page, stack
    page.close()


def test_the_grid_follows_the_placement_as_you_type(logged_in_page):
    page, stack = logged_in_page
    grid = page.locator("#placement-result")
    expect(grid.locator('[data-resource="RTX4090 0"] [data-component="actor"]')).to_have_text(
        "actor 0"
    )
    editor = page.get_by_label("component_placement")
    editor.fill('actor: 0-1:0-3\nenv:\n  node_group: robot\n  placement: "0:0-1"\n')
    expect(grid.locator('[data-resource="RTX4090 1"] [data-component="actor"]')).to_have_text(
        "actor 2-3"
    )
    expect(grid.locator('.robot [data-component="env"]')).to_have_text("env 0-1")
    expect(grid.locator('.legend [data-component="inference"]')).to_have_count(0)
    page.screenshot(path=str(stack.log_dir / "placement.png"), full_page=True)


def test_errors_show_beside_their_line(logged_in_page):
    page, stack = logged_in_page
    editor = page.get_by_label("component_placement")
    editor.fill('actor: 0-1\nenv:\n  node_group: robot\n  placement: "0-5:0-1"\n')
    issues = page.locator("#config-issues li")
    expect(issues.first).to_contain_text("env")
    expect(issues.first.locator(".line-ref")).to_have_text("line 4")
    expect(page.locator("#placement-gutter .bad")).to_have_text("4")
    page.screenshot(path=str(stack.log_dir / "placement-errors.png"), full_page=True)


def test_homes_launch_dialog_shows_where_the_run_will_go(operator_page):
    page = operator_page
    import_cluster_yaml("lab", (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text())
    create_experiment("demo", (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text())
    page.goto(page.web.url + "/")
    page.get_by_role("link", name="Launch run").click()
    dialog = page.get_by_role("dialog", name="Launch a run")
    plan = dialog.locator(".launch-plan")
    expect(plan).to_contain_text("This process, no placement: the run is one process")
    dialog.get_by_label("Cluster").select_option("lab")
    expect(plan.locator('[data-resource="RTX4090 0"] [data-component="actor"]')).to_have_text(
        "actor 0"
    )
    expect(plan.locator('.legend [data-component="env"]')).to_contain_text("env × 4")
    page.screenshot(path=str(page.web.log_dir / "launch-dialog.png"), full_page=True)
