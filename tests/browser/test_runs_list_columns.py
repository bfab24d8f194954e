"""In Chromium: a researcher adds a metric and a config key as columns of the runs list,
sorts by one, and the rows keep their cells while the runs update live."""

import pytest
from playwright.sync_api import expect

from controlplane.experiments.services import create_experiment
from controlplane.runs.models import RunState
from controlplane.runs.state import transition
from tests.browser.off_loop import off_the_loop
from tests.runs import run_with

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_a_column_is_added_sorted_and_kept_through_live_updates(operator_page, settings):
    page = operator_page
    settings.ARMATURE_WEB_URL = page.web.url  # this process's broadcasts reach the page
    experiment = create_experiment("columns", "algorithm: {name: ppo}\n")
    low = run_with(experiment, 10, [0.9, 0.2])
    high = run_with(experiment, 9, [0.1, 0.7])
    page.goto(page.web.url + "/runs/")
    page.get_by_label("Add column").fill("metric:rollout/success_rate")
    page.get_by_role("button", name="Apply").click()
    page.get_by_label("Add column").fill("config:runner.iterations")
    page.get_by_role("button", name="Apply").click()

    headers = page.locator("th.chosen")
    expect(headers).to_have_count(2)
    expect(headers.first).to_contain_text("rollout/success_rate")
    expect(page.locator(f"#run-row-{high.pk} td.chosen")).to_have_text(["0.7", "9"])
    headers.first.get_by_role("link", name="rollout/success_rate", exact=True).click()  # highest
    expect(headers.first).to_have_attribute("aria-sort", "descending")
    rows = page.locator("tbody tr[id^=run-row-]")
    expect(rows).to_have_count(2)
    expect(rows.first).to_have_id(f"run-row-{high.pk}")
    headers.first.get_by_role("link", name="rollout/success_rate ↓", exact=True).click()  # lowest
    expect(rows.first).to_have_id(f"run-row-{low.pk}")
    page.screenshot(path=str(page.web.log_dir / "runs-columns.png"), full_page=True)

    # A live update replaces the row; its chosen cells stay.
    off_the_loop(transition, low.pk, RunState.SUBMITTING)  # publishes to the page
    row = page.locator(f"#run-row-{low.pk}")
    expect(row.locator(".badge")).to_have_text("Submitting", timeout=15_000)
    expect(row.locator("td.chosen")).to_have_text(["0.2", "10"])

    page.get_by_role("link", name="remove the column rollout/success_rate").click()
    expect(headers).to_have_count(1)
    expect(headers.first).to_contain_text("runner.iterations")
