"""In Chromium, against a live daphne: a sweep started from its experiment's page (the
form shows each problem at its key), its page's trials table best first, the objective
against each parameter and the best so far as charts, all following the sweep's steps
without a reload, and the best trial one click from a new revision."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.experiments.services import create_experiment
from controlplane.runs import metric_points
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from controlplane.sweeps.models import Sweep
from controlplane.sweeps.progress import advance
from tests.browser.off_loop import off_the_loop

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SPEC = """space:
  actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
  algorithm.clip_ratio: {uniform: [0.1, 0.3]}
objective: {metric: rollout/success_rate, direction: max, last: 1}
budget: {trials: 3, parallel: 2}
sampler: random
pruner: none
"""


@pytest.fixture
def page(browser, web, settings):
    settings.ARMATURE_WEB_URL = web.url  # this process's broadcasts reach that server
    user = get_user_model().objects.create_user("sue", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    create_experiment("tuned", open("examples/builtin_ppo.yaml").read(), author=user)
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(web.url + "/login/")
    page.get_by_label("Username").fill("sue")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    page.web = web
    yield page
    page.close()
    assert not errors, errors


def finish(run: Run, value: float) -> None:
    """What a trainer does to its run: it starts, logs `value` once and succeeds."""
    transition(run.pk, RunState.SUBMITTING)
    transition(run.pk, RunState.RUNNING)
    metric_points.store_points(run.pk, 1, 1.7e9, {"rollout/success_rate": value})
    transition(run.pk, RunState.SUCCEEDED)


def chart(page, name: str) -> list[list]:
    return page.evaluate(f"() => window.armatureCharts[{name!r}].data.map((s) => Array.from(s))")


def test_a_sweep_started_from_the_browser_follows_its_trials_live(page):
    url = page.web.url
    page.goto(f"{url}/experiments/tuned/")
    page.get_by_role("link", name="Sweep…").click()
    editor = page.locator("#id_spec")
    expect(editor).to_contain_text("actor.learning_rate")  # a starting point to edit
    editor.fill(SPEC.replace("algorithm.clip_ratio: {uniform: [0.1, 0.3]}",
                             "algorithm.nope: {uniform: [0.1, 0.3]}"))  # fmt: skip
    page.get_by_role("button", name="Start the sweep").click()
    problem = page.locator("#config-issues li[data-path='space.algorithm.nope']")
    expect(problem).to_contain_text("line 3")  # at its key, on its line
    expect(problem).to_contain_text("unknown key")
    assert not Sweep.objects.exists()
    editor.fill(SPEC)
    page.get_by_role("button", name="Start the sweep").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text("tuned r1")
    (sweep,) = Sweep.objects.all()
    expect(page.locator(".live-dot:not(.on)")).to_have_count(0, timeout=15_000)

    # Two trials run at once; each run that ends is its trial's objective, live.
    off_the_loop(advance, sweep.pk)
    rows = page.locator("#sweep-trials tbody tr[data-trial]")
    expect(rows).to_have_count(2)
    first, second = sweep.trials.order_by("number")
    off_the_loop(finish, first.run, 0.3)
    off_the_loop(finish, second.run, 0.6)
    off_the_loop(advance, sweep.pk)
    expect(rows).to_have_count(3)
    expect(rows.nth(0)).to_have_attribute("data-trial", str(second.number))  # best first
    expect(rows.nth(0).locator("[data-field=value]")).to_have_text("0.6000")
    expect(page.locator("#sweep-header [data-field=trials]")).to_have_text("2 of 3 trials ended")
    learning_rates = sorted(t.params["actor.learning_rate"] for t in (first, second))
    xs, ys = chart(page, "param:actor.learning_rate")
    assert xs == pytest.approx(learning_rates)
    assert sorted(ys) == [0.3, 0.6]
    assert chart(page, "best-so-far") == [[first.number, second.number, 2], [0.3, 0.6, 0.6]]

    third = sweep.trials.get(number=2)
    off_the_loop(finish, third.run, 0.9)
    off_the_loop(advance, sweep.pk)
    expect(page.locator("#sweep-header .badge").first).to_have_text("Finished")
    expect(rows.nth(0)).to_have_attribute("data-trial", "2")
    expect(page.locator("#sweep-header [data-field=best]")).to_contain_text("0.9000 (trial 2")
    assert chart(page, "best-so-far")[1] == [0.3, 0.6, 0.9]
    importances = page.locator("#sweep-importances li")
    expect(importances).to_have_count(2)

    page.get_by_role("button", name="New revision from the best trial").click()
    expect(page.get_by_role("heading", name="Experiment tuned")).to_be_visible()
    written = f"Revision 2: best trial 2 of sweep {sweep.pk}"
    expect(page.locator(".messages")).to_contain_text(written)
    revision = sweep.experiment.revisions.get(number=2)
    assert f"learning_rate: {third.params['actor.learning_rate']}" in revision.config_yaml
