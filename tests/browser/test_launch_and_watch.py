"""In Chromium: launch a run from its experiment and watch it succeed live; stop another."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.experiments.services import create_experiment

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(400),
    pytest.mark.embedded,
]


@pytest.fixture
def page(browser, stack_factory, ray_head):
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    create_experiment("demo", (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text())
    user = get_user_model().objects.create_user("olga", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    page = browser.new_page()
    page.goto(stack.url + "/login/?next=/experiments/demo/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    page.stack = stack
    yield page
    page.close()


def launch(page, iterations: int) -> None:
    page.goto(page.stack.url + "/experiments/demo/")
    page.get_by_label("Overrides").fill(f"runner.iterations={iterations}")
    page.get_by_role("button", name="Launch").click()
    expect(page.get_by_role("heading", name="Run")).to_be_visible()


def test_a_launched_run_goes_live_to_succeeded(page):
    launch(page, 3)
    header = page.locator("#run-header")
    expect(header).to_have_attribute("data-state", "succeeded", timeout=180_000)
    expect(page.locator("#run-logs")).to_contain_text("finished 3/3 iterations", timeout=30_000)
    # The real trainer's metrics on the charts: one line per horizon of the pattern (5,
    # 10, 15), every iteration once; and its per-task counts in the task table.
    lines = page.wait_for_function(
        """() => {
          const chart = window.armatureCharts && window.armatureCharts.success_horizon;
          if (!chart || !chart.armature || chart.data[0].length !== 3) return null;
          return chart.armature.lines.map(l => [l.label, chart.data[0], chart.data[l.mean]]);
        }""",
        timeout=30_000,
    ).json_value()
    assert [label for label, _, _ in lines] == ["h5", "h10", "h15"]
    for _, steps, rates in lines:
        assert steps == [1, 2, 3] and all(0 <= r <= 1 for r in rates)
    expect(page.locator("#task-table tbody tr")).to_have_count(3)  # one task per iteration
    expect(page.locator('#run-summary [data-field="iteration"]')).to_have_text("3 / 3")
    # The model card the trainer sent once it had built the policy.
    card = page.locator("#run-model")
    expect(card.locator("tr", has_text="Kind")).to_contain_text("mlp")
    expect(card.locator("tr", has_text="Hidden sizes")).to_contain_text("64, 64")
    trained = card.locator("tr", has_text="Trainable parameters").locator("td").inner_text()
    assert int(trained.replace(",", "")) > 1000
    # The example records two episodes of iteration 1's task: the real trainer's videos.
    episodes = page.locator("#run-episodes figure.episode")
    expect(episodes).to_have_count(2, timeout=20_000)
    expect(episodes.first.locator("figcaption")).to_contain_text("iteration 1")
    video = episodes.first.locator("video")
    page.wait_for_function("v => v.readyState >= 1 && v.duration > 0", arg=video.element_handle())
    page.screenshot(path=str(page.stack.log_dir / "run.png"), full_page=True)
    page.goto(page.stack.url + "/runs/")
    expect(page.locator("tr[data-state=succeeded]")).to_have_count(1)


def test_stop_asks_first_then_cancels(page):
    launch(page, 100_000)
    expect(page.locator("#run-header")).to_have_attribute("data-state", "running", timeout=180_000)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    expect(page.locator("#run-header")).to_have_attribute("data-state", "cancelled", timeout=60_000)
