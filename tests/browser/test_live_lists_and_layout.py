"""In Chromium: Home and the runs list follow runs live (a new run appears, a finished
one leaves "Active"), without htmx errors; Home's launch dialog; wide placement grids
scroll inside their card; the config editor spans the page; the favicon."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.experiments.services import create_experiment
from controlplane.inventory.services import import_cluster_yaml
from controlplane.realtime.publish import publish
from controlplane.runs import telemetry
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from tests.browser.off_loop import off_the_loop
from tests.runs import queued_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


@pytest.fixture
def session(browser, stack_factory, settings):
    stack = stack_factory()
    stack.start_web()
    settings.ARMATURE_WEB_URL = stack.url  # this process's broadcasts reach that server
    experiment = create_experiment("demo", CONFIG)
    user = get_user_model().objects.create_user("olga", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    # A refused form submitted as a whole page answers 422 by design, which Chromium logs
    # as a failed load (as-you-type fragments answer 200).
    page.on(
        "console",
        lambda m: (
            errors.append(m.text) if m.type == "error" and "status of 422" not in m.text else None
        ),
    )
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(stack.url + "/login/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    page.stack, page.errors, page.experiment = stack, errors, experiment
    yield page
    page.close()


def move(run: Run, state: RunState, reason: str = "") -> None:
    off_the_loop(transition, run.pk, state, reason)


def report(run: Run, message: dict) -> None:
    """What the trainer consumer does with a message: store it, then tell browsers."""

    def store_and_tell() -> None:
        telemetry.record(run.pk, message)
        for group, event in telemetry.broadcast_messages(run.pk, message):
            publish(group, event)

    off_the_loop(store_and_tell)


def live(page, timeout_ms: int = 40_000) -> None:
    """Every socket of the page is open (each section's dot is on)."""
    expect(page.locator(".live-dot").first).to_be_visible()
    expect(page.locator(".live-dot:not(.on)")).to_have_count(0, timeout=timeout_ms)


def test_home_follows_a_run_from_launch_to_finish(session):
    page = session
    live(page)
    active = page.locator("tbody[data-accept=active]")
    recent = page.locator("tbody[data-accept=final]")
    expect(active.get_by_text("Nothing running.")).to_be_visible()

    run = queued_run(page.experiment)
    move(run, RunState.SUBMITTING)
    row = active.locator(f"#run-row-{run.pk}")
    expect(row).to_have_attribute("data-state", "submitting", timeout=10_000)
    expect(active.get_by_text("Nothing running.")).to_be_hidden()

    move(run, RunState.RUNNING)
    expect(row).to_have_attribute("data-state", "running", timeout=10_000)
    # An iteration reported: the row's progress and latest success follow in place.
    report(run, {"type": "metrics", "seq": 1, "step": 1, "time": 1.0,
                 "values": {"rollout/success_rate": 0.75}})  # fmt: skip
    report(run, {"type": "progress", "seq": 2, "step": 1, "total": 4})
    expect(row.locator("td.success")).to_have_text("0.75", timeout=10_000)
    move(run, RunState.SUCCEEDED, "done")
    expect(recent.locator(f"#run-row-{run.pk}")).to_have_attribute(
        "data-state", "succeeded", timeout=10_000
    )
    expect(active.locator("tr[id^=run-row-]")).to_have_count(0)
    expect(active.get_by_text("Nothing running.")).to_be_visible()
    assert page.errors == []


def test_the_runs_list_shows_new_runs_that_match_its_filters(session):
    page = session
    other = create_experiment("other", CONFIG)
    page.goto(page.stack.url + "/runs/?experiment=demo")
    live(page)
    mine, theirs = queued_run(page.experiment), queued_run(other)
    move(theirs, RunState.SUBMITTING)
    move(mine, RunState.SUBMITTING)
    rows = page.locator("tbody[data-live-runs] tr[id^=run-row-]")
    expect(rows).to_have_count(1, timeout=10_000)
    expect(rows.first).to_have_id(f"run-row-{mine.pk}")
    move(mine, RunState.RUNNING)
    expect(rows.first).to_have_attribute("data-state", "running", timeout=10_000)
    assert page.errors == []


def test_runs_that_changed_while_the_socket_was_down_show_after_it_reconnects(session):
    page = session
    live(page)
    active = page.locator("tbody[data-accept=active]")
    page.stack.close()  # the web server goes away: the page's sockets drop
    expect(page.locator(".live-dot.on")).to_have_count(0, timeout=15_000)
    run = queued_run(page.experiment)
    Run.objects.filter(pk=run.pk).update(state=RunState.RUNNING)  # no one is told
    page.stack.start_web()  # the same address: the sockets reconnect by themselves
    # htmx retries a dropped socket after a random delay of up to 2^n s (64 s at most):
    # after the few retries of a restart that can pass 15 s.
    live(page, timeout_ms=70_000)
    expect(active.locator(f"#run-row-{run.pk}")).to_have_attribute(
        "data-state", "running", timeout=15_000
    )
    expect(active.get_by_text("Nothing running.")).to_be_hidden()


def test_a_row_pushed_while_the_tables_are_fetched_afresh_is_not_undone_by_them(session):
    page = session
    live(page)
    run = queued_run(page.experiment)
    move(run, RunState.SUBMITTING)
    row = page.locator(f"tbody[data-accept=active] #run-row-{run.pk}")
    expect(row).to_have_attribute("data-state", "submitting", timeout=10_000)
    held = []  # the tables' fetch after the reconnect, answered only when the test says
    page.route(page.url, lambda route: held.append((route, route.fetch())))
    page.stack.close()
    expect(page.locator(".live-dot.on")).to_have_count(0, timeout=15_000)
    page.stack.start_web()
    live(page)
    for _ in range(150):  # playwright runs the route handler while the page is waited on
        if held:
            break
        page.wait_for_timeout(100)
    assert held, "the page did not fetch its tables after reconnecting"
    move(run, RunState.RUNNING)  # pushed while the fetch (rendered before it) is out
    expect(row).to_have_attribute("data-state", "running", timeout=10_000)
    route, response = held[0]
    route.fulfill(response=response)  # the older tables land now
    page.wait_for_timeout(1000)
    expect(row).to_have_attribute("data-state", "running")
    page.unroute(page.url)


def test_home_launch_dialog_launches_and_a_rejected_launch_keeps_the_input(session):
    page = session
    page.get_by_role("link", name="Launch run").click()
    dialog = page.get_by_role("dialog", name="Launch a run")
    expect(dialog).to_be_visible()
    dialog.get_by_label("Experiment").select_option("demo")
    dialog.get_by_label("Overrides").fill("runner.iterations=-5")
    dialog.get_by_role("button", name="Launch").click()
    # Refused: the experiment's page again, with the message and what was typed.
    expect(page.get_by_role("alert").first).to_contain_text("runner.iterations")
    expect(page.get_by_label("Overrides")).to_have_value("runner.iterations=-5")

    page.goto(page.stack.url + "/")
    page.get_by_role("link", name="Launch run").click()
    dialog.get_by_label("Overrides").fill("runner.iterations=2")
    dialog.get_by_role("button", name="Launch").click()
    expect(page.get_by_role("heading", name="Run")).to_contain_text("demo")
    assert Run.objects.get().overrides == ["runner.iterations=2"]


def test_wide_grids_scroll_in_their_card_and_the_editor_spans_the_page(session):
    page = session
    wide = settings.BASE_DIR / "examples/clusters/heterogeneous_18_nodes.yaml"
    import_cluster_yaml("big", wide.read_text())
    page.goto(page.stack.url + "/cluster/big/placement/")
    page.get_by_label("component_placement").fill("actor: 0-17")
    box = page.locator(".grid-scroll")
    expect(box.locator("[data-component=actor]").first).to_be_visible()
    page_width = page.evaluate("document.scrollingElement.scrollWidth")
    assert page_width <= 1440, f"the page scrolls sideways ({page_width} px)"
    assert box.evaluate("b => b.scrollWidth > b.clientWidth"), "the grid does not scroll"
    # Scrolled and measured in one go: a late preview answer may redraw the grid.
    offset = box.evaluate(
        """b => { b.scrollLeft = b.scrollWidth;
                  const th = b.querySelector("th[scope=row]");
                  return th.getBoundingClientRect().x - b.getBoundingClientRect().x; }"""
    )
    assert abs(offset) < 2, f"node names scroll away ({offset} px)"

    page.goto(page.stack.url + "/experiments/demo/")
    editor = page.get_by_label("Latest revision (r1)")
    main = page.locator("main").bounding_box()
    assert editor.bounding_box()["width"] > 0.8 * main["width"]
    editor.fill(CONFIG.replace("iterations: 60", "iterations: -3"))
    issue = page.locator("#config-issues li", has_text="runner.iterations")
    expect(issue.locator(".line-ref")).to_have_text(f"line {line_of('iterations: 60')}")
    expect(page.locator(".code-editor pre.gutter .bad")).to_have_text(
        str(line_of("iterations: 60"))
    )

    icon = page.locator("link[rel=icon]").get_attribute("href")
    assert page.request.get(page.stack.url + icon).ok
    assert page.errors == []


def line_of(text: str) -> int:
    return next(n for n, line in enumerate(CONFIG.splitlines(), 1) if text in line)
