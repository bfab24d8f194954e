"""In Chromium: every page loads under the Content-Security-Policy (no inline script or
style, no eval) without a single violation, and still works; a metric key carrying
markup shows as text on the run page and runs nothing."""

import re

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.core.bootstrap import seed_demo
from controlplane.runs import artifacts
from controlplane.runs.evaluations import EvalRequest, request_evaluation
from controlplane.runs.models import MetricKey, MetricPoint, Run, RunState
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.evaluation.protocol import EvalTable, TaskResult
from trainer.link.client import TrainerLink
from trainer.link.reporter import eval_summary

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# Chromium reports a blocked script, style, connection or image as a console error and as
# a `securitypolicyviolation` event; both are collected.
REPORT_VIOLATIONS = """
document.addEventListener("securitypolicyviolation", (e) => console.error(
  `CSP violation: ${e.violatedDirective} blocked ${e.blockedURI} at ${e.sourceFile}`));
"""
XSS_TASK = "<img src=x onerror=alert(document.cookie)>"


class Watched:
    """A logged-in page whose CSP violations, page errors and dialogs are collected."""

    def __init__(self, browser, url: str):
        self.url = url
        self.page = browser.new_page(viewport={"width": 1440, "height": 1000})
        self.violations: list[str] = []
        self.errors: list[str] = []
        self.dialogs: list[str] = []
        self.page.add_init_script(REPORT_VIOLATIONS)
        self.page.on("console", self._console)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("dialog", self._dialog)

    def _console(self, message) -> None:
        if "Content Security Policy" in message.text or "CSP violation" in message.text:
            self.violations.append(f"{self.page.url}: {message.text}")

    def _dialog(self, dialog) -> None:
        self.dialogs.append(dialog.message)
        dialog.dismiss()

    def open(self, path: str) -> None:
        response = self.page.goto(self.url + path)
        assert response is not None and response.ok, f"{path}: {response and response.status}"
        policy = response.headers.get("content-security-policy", "")
        assert "script-src 'self'" in policy and "unsafe" not in policy, (path, policy)

    def log_in(self, username: str) -> None:
        self.open("/login/")
        self.page.get_by_label("Username").fill(username)
        self.page.get_by_label("Password").fill("pw-for-tests")
        self.page.get_by_role("button", name="Log in").click()
        expect(self.page.get_by_role("heading", name="Home")).to_be_visible()


def live(page) -> None:
    expect(page.locator(".live-dot").first).to_be_visible()
    expect(page.locator(".live-dot:not(.on)")).to_have_count(0, timeout=15_000)


def fed_run(url: str, name, steps: int) -> Run:
    """A run whose trainer link reported `steps` iterations (success, a task's counts)."""
    run = submitted_run(name)
    link = TrainerLink(url, run.pk, make_run_token(run.pk))
    link.event("started")
    for step in range(1, steps + 1):
        values = {
            "rollout/success_rate": step / 10,
            "losses/policy_loss": 1.0 / step,
            "counts/task0/episodes": 4.0,
            "counts/task0/successes": float(step % 5),
        }
        link.metrics(step, values)
        link.progress(step, 10)
    wait_until(lambda: link.pending() == 0, 30, "the link's acknowledgements")
    link.close(timeout=30)
    return run


def evaluated_run(url: str, source: Run, user) -> Run:
    """An eval run of `source`'s checkpoint 4 whose trainer reported its table: task 0
    succeeds 3 of 4 times, task 1 once."""
    folder = artifacts.run_artifact_dir(source.pk) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "iter_4.pt").write_bytes(b"weights")
    run, _ = request_evaluation(source, EvalRequest(checkpoint=4), user=user)
    transition(run.pk, RunState.SUBMITTING)
    results = [
        TaskResult(task, f"task_{task}", 4, won, {5: [won, 4]}) for task, won in ((0, 3), (1, 1))
    ]
    table = EvalTable("builtin_reach", None, "iter_4.pt", 4, [5], results).to_json()
    link = TrainerLink(url, run.pk, make_run_token(run.pk))
    link.event("started", {"mode": "eval"})
    link.event("evaluated", table)
    link.event("finished", {"summary": eval_summary(table)})
    link.close(timeout=30)
    wait_until(lambda: Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED, 30, "the eval")
    return run


def chart_points(page, chart: str) -> int:
    return page.evaluate(
        "name => (window.armatureCharts[name]?.data?.[0] || []).length", chart
    )  # fmt: skip


@pytest.fixture
def site(browser, web, settings):
    settings.ARMATURE_WEB_URL = web.url  # this process's broadcasts reach that server
    cluster, experiment = seed_demo()
    admin = get_user_model().objects.create_user(
        "ada", password="pw-for-tests", is_staff=True, is_superuser=True
    )
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    first = fed_run(web.url, experiment, 4)
    second = fed_run(web.url, experiment, 3)
    evaluation = evaluated_run(web.url, first, admin)
    watched = Watched(browser, web.url)
    watched.evaluation = evaluation
    console = (settings.BASE_DIR / "examples/builtin_rlpd_console.yaml").read_text()
    watched.console_run = submitted_run("console-demo", console)
    yield watched, cluster, experiment, first, second
    watched.page.close()


def test_every_page_loads_under_the_policy_without_a_violation_and_works(site):
    watched, cluster, experiment, first, second = site
    page = watched.page
    watched.log_in("ada")  # the login page, and its form posting

    live(page)  # Home: the status and runs sockets
    page.get_by_role("link", name="Launch run").click()
    expect(page.get_by_role("dialog", name="Launch a run")).to_be_visible()
    page.keyboard.press("Escape")

    watched.open("/runs/")
    live(page)
    expect(page.locator(f"#run-row-{first.pk}")).to_be_visible()
    page.locator(f"#compare-pick-{first.pk}").check()
    page.locator(f"#compare-pick-{second.pk}").check()
    page.get_by_role("button", name="Compare (2)").click()
    expect(page.locator("#compare-legend li")).to_have_count(2)
    wait_until(lambda: chart_points(page, "compare_success") == 4, 15, "the compare chart")

    watched.open(f"/runs/{first.pk}/")
    live(page)
    wait_until(lambda: chart_points(page, "success") == 4, 15, "the run page's chart")
    expect(page.locator('#task-table tbody tr[data-task="0"]')).to_be_visible()
    # Evaluation cells are coloured by their rate through element.style (no style
    # attribute): 3 of 4 → hue 90, 1 of 4 → hue 30.
    hues = page.locator("#run-evaluations td.rate").evaluate_all(
        "cells => cells.map(c => [c.dataset.hue, getComputedStyle(c).getPropertyValue('--hue')])"
    )
    assert hues and all(mine == applied.strip() for mine, applied in hues), hues
    assert {"90", "30"} <= {mine for mine, _ in hues}, hues
    watched.open(f"/runs/{watched.evaluation.pk}/")
    live(page)  # its socket's first push has re-rendered the table
    colours: list[str] = []

    def two_colours() -> bool:  # two rates, two colours
        nonlocal colours
        colours = page.locator("#eval-table tbody td.rate").evaluate_all(
            "cells => cells.map(c => getComputedStyle(c).backgroundColor)"
        )
        return len(set(colours)) == 2 and "" not in colours

    wait_until(two_colours, 10, f"the eval table's colours ({colours})")
    watched.open(f"/runs/{first.pk}/")
    page.get_by_label("Diff against").select_option(str(second.pk))
    page.get_by_role("button", name="Diff").click()  # a form without an inline handler
    expect(page).to_have_url(re.compile(rf"/runs/{first.pk}/diff/{second.pk}/$"))

    watched.open("/experiments/")
    watched.open(f"/experiments/{experiment.name}/")
    editor = page.get_by_label(re.compile("Latest revision"))
    editor.fill(experiment.latest_revision.config_yaml.replace("iterations:", "iterations: -3 #"))
    expect(page.locator("#config-issues li", has_text="runner.iterations")).to_be_visible()

    watched.open("/cluster/")
    watched.open(f"/cluster/{cluster.name}/")
    watched.open(f"/cluster/{cluster.name}/edit/")
    watched.open(f"/cluster/{cluster.name}/placement/")
    page.get_by_label("component_placement").fill("actor: 0\n")
    expect(page.locator('#placement-result [data-component="actor"]').first).to_be_visible()

    watched.open("/robots/")
    watched.open("/console/")
    watched.open(f"/console/runs/{watched.console_run.pk}/")
    expect(page.locator("#link-state")).to_have_text("no trainer", timeout=15_000)  # socket open
    # Camera frames arrive as data: URLs.
    page.evaluate("""() => { const img = document.getElementById("camera");
      img.src = "data:image/gif;base64,R0lGODlhAQABAAAAACw=";
      return img.decode().catch(() => null); }""")
    watched.open("/console/audit/")

    watched.open("/settings/")
    page.get_by_label("Name").fill("ci")
    page.get_by_label("Your password").fill("pw-for-tests")
    page.get_by_role("button", name="Create token").click()
    expect(page.locator("#new-token")).to_contain_text("arm_")
    expect(page.locator(".new-token")).to_have_css("border-top-style", "solid")  # app.css

    watched.open("/api/v1/docs/")
    # Swagger UI renders once it has fetched the schema, which the server generates from
    # every API view on the first request: seconds on a loaded CI machine.
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Armature API", timeout=30_000)
    expect(page.locator(".opblock").first).to_be_visible()

    watched.open("/admin/")
    expect(page.locator("#site-name")).to_be_visible()

    assert watched.violations == []
    assert watched.errors == []

    # The policy is enforced, not only sent: an inline script is refused and reported.
    watched.open("/")
    ran = page.evaluate("""() => { const s = document.createElement("script");
      s.textContent = "window.inlineRan = true"; document.body.append(s);
      return window.inlineRan === true; }""")
    assert ran is False
    wait_until(lambda: watched.violations != [], 5, "the violation report")


def test_a_metric_key_with_markup_shows_as_text_and_runs_nothing(site):
    watched, _, experiment, _, _ = site
    page = watched.page
    run = submitted_run(experiment)
    # Stored directly: the link protocol refuses such keys; older data may hold them.
    for what, value in (("episodes", 4.0), ("successes", 3.0)):
        key = MetricKey.objects.create(run=run, name=f"counts/task{XSS_TASK}/{what}")
        MetricPoint.objects.create(key=key, step=1, value=value, wall_time=1.0)
    watched.log_in("ada")
    watched.open(f"/runs/{run.pk}/")
    row = page.locator("#task-table tbody tr").first
    expect(row.locator('td[data-column="task"]')).to_have_text(f"task {XSS_TASK}")
    expect(row.locator('td[data-column="rate"]')).to_have_attribute("data-value", "0.75")
    assert row.get_attribute("data-task") == XSS_TASK
    assert page.locator("#task-table img").count() == 0
    assert page.locator("img[src=x]").count() == 0
    page.wait_for_timeout(500)  # an image error handler would have fired by now
    assert watched.dialogs == []
    assert watched.errors == []
    assert watched.violations == []
