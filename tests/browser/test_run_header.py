"""In Chromium: a run's header says how it was started — where it runs (a cluster, or
this process with no placement), its overrides, tags, who started it and when — and a
run that ended well says so plainly, not as an error. The console is offered only for a
run with robots an operator can take over."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from controlplane.inventory.models import Cluster
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from tests.runs import submitted_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

CONSOLE = (settings.BASE_DIR / "examples/builtin_rlpd_console.yaml").read_text()


@pytest.fixture
def page(operator_page):
    return operator_page


def header(page, run: Run):
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    return page.locator("#run-header")


def test_the_header_says_where_with_what_and_by_whom_a_run_was_started(page):
    run = submitted_run("placed")
    Run.objects.filter(pk=run.pk).update(
        cluster=Cluster.objects.create(name="lab", num_nodes=2),
        overrides=["runner.iterations=3", "env.num_parallel_envs=4"], tags=["sweep-a", "ppo"],
        created_by=get_user_model().objects.get(username="rita"),
    )  # fmt: skip
    shown = header(page, run)
    expect(shown.locator('[data-field="where"]')).to_have_text("cluster lab")
    expect(shown.locator('[data-field="where"] a')).to_have_attribute("href", "/cluster/lab/")
    expect(shown.locator('[data-field="overrides"] code')).to_have_text(
        ["runner.iterations=3", "env.num_parallel_envs=4"]
    )
    expect(shown.locator('[data-field="tags"] .tag')).to_have_text(["sweep-a", "ppo"])
    expect(shown.locator('[data-field="creator"]')).to_contain_text("rita · ")

    alone = header(page, submitted_run("in-process"))
    expect(alone.locator('[data-field="where"]')).to_have_text("this process, no placement")
    expect(alone.locator('[data-field="where"] span')).to_have_attribute(
        "title", "No cluster was picked: the whole run (rollout, learner, envs) is one trainer "
        "process, a Ray job on the control plane's own Ray, with no placement",
    )  # fmt: skip
    expect(alone.locator('[data-field="overrides"]')).to_have_text("none")
    expect(page.get_by_role("link", name="Open console")).to_have_count(0)  # no robots


def test_a_run_that_ended_well_says_so_plainly_and_a_failure_as_an_error(page):
    good, bad = submitted_run("good"), submitted_run("bad")
    transition(good.pk, RunState.SUCCEEDED, "the trainer finished")
    transition(bad.pk, RunState.FAILED, "Segmentation fault")
    note = header(page, good).locator("pre.exit-reason")
    expect(note).to_have_text("the trainer finished")
    expect(note).not_to_have_class("exit-reason failed")
    assert note.evaluate("e => getComputedStyle(e).color") != "rgb(216, 222, 233)"  # not the log's
    expect(header(page, bad).locator("pre.exit-reason")).to_have_class("exit-reason failed")


def test_the_console_is_offered_for_a_run_with_operator_robots(page):
    run = submitted_run("with-robots", CONSOLE)
    header(page, run)
    page.get_by_role("link", name="Open console").click()
    expect(page.get_by_role("heading", name=f"Console · run {run.pk}")).to_be_visible()
