"""In Chromium: press Evaluate on a finished run's page and watch the eval run's table
arrive live, with the numbers the trainer reported; the source run's page and the
compare page show the same figures."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.experiments.services import create_experiment
from controlplane.runs.eval_tables import table_of
from controlplane.runs.launch import launch_run
from controlplane.runs.models import Run, RunKind, RunState
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(400)]


@pytest.fixture
def trained(stack_factory, ray_head):
    """A live control plane, an operator, and a run of the built-in env trained to the
    end (checkpoints at iterations 6 and 12)."""
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    experiment = create_experiment(
        "demo", (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
    )
    user = get_user_model().objects.create_user("olga", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    overrides = ["runner.iterations=12", "runner.checkpoint_every=6"]
    run, _ = launch_run(experiment, user=user, overrides=overrides)
    wait_until(lambda: Run.objects.get(pk=run.pk).is_final, 240, "the training run", 0.5)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    return stack, run


@pytest.fixture
def page(browser, trained):
    stack, run = trained
    page = browser.new_page()
    page.goto(f"{stack.url}/login/?next=/runs/{run.pk}/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.locator("#run-header")).to_have_attribute("data-state", "succeeded")
    page.stack, page.source = stack, run
    yield page
    page.close()


def cells(page, selector: str) -> list[list[str]]:
    return page.locator(selector).evaluate_all(
        "rows => rows.map(r => [...r.cells].map(c => c.textContent.trim()))"
    )


def test_evaluate_on_a_finished_runs_page_shows_the_table_live(page):
    source = page.source
    form = page.locator("#evaluate-form")
    expect(form.get_by_label("Checkpoint")).to_have_value("12")  # the newest by default
    form.get_by_label("Tasks").fill("0,3")
    form.get_by_label("States per task").fill("4")
    form.get_by_role("button", name="Evaluate").click()

    # The eval run's own page, open while it is queued: the table arrives over its socket.
    expect(page.locator(".page-head h1")).to_contain_text("evaluation")
    run = Run.objects.get(kind=RunKind.EVAL)
    assert page.url.endswith(f"/runs/{run.pk}/")
    expect(page.locator("#eval-table")).to_be_visible(timeout=180_000)
    expect(page.locator("#run-header")).to_have_attribute("data-state", "succeeded")
    table = table_of(run)
    assert [t["task_id"] for t in table["tasks"]] == [0, 3]
    rows = cells(page, "#eval-table tbody tr")
    assert rows == [
        [str(t["task_id"]), t["name"], f"{t['successes']} / 12", f"{t['rate']:.3f}",
         *(f"{t['per_horizon'][h]['rate']:.3f}" for h in ("5", "10", "15"))]
        for t in table["tasks"]
    ]  # fmt: skip
    footer = cells(page, "#eval-table tfoot tr")[0]
    successes = sum(t["successes"] for t in table["tasks"])
    assert footer[:3] == ["Suite average", f"{successes} / 24", f"{table['average']:.3f}"]
    assert footer[3:] == [f"{table['horizon_average'][h]:.3f}" for h in ("5", "10", "15")]
    page.screenshot(path=str(page.stack.log_dir / "eval-run.png"), full_page=True)

    page.goto(f"{page.stack.url}/runs/{source.pk}/")
    listed = page.locator(f'#evaluation-list tr[data-run="{run.pk}"]')
    expect(listed.locator('[data-field="average"]')).to_have_text(f"{table['average']:.3f}")
    page.locator("#run-evaluations").screenshot(path=str(page.stack.log_dir / "source-evals.png"))

    page.goto(f"{page.stack.url}/runs/compare/?ids={source.pk},{run.pk}")
    side = page.locator("#compare-evaluations table")
    expect(side.locator("thead th")).to_have_count(3)  # task + a column per run
    average = cells(page, '#compare-evaluations tr[data-task="average"]')[0]
    assert average == ["Suite average", f"{table['average']:.3f}", f"{table['average']:.3f}"]
    page.locator("#compare-evaluations").screenshot(path=str(page.stack.log_dir / "compare.png"))
