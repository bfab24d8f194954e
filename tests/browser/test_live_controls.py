"""In Chromium, against a live daphne: controls on live pages stay the same elements while
a run streams (Stop can be clicked; the runs list's tick boxes and links survive the
row updates), and the run page's Files and Evaluations cards follow what the run writes
without a reload."""

import threading
import time

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import expect

from controlplane.runs import artifacts
from controlplane.runs.evaluations import EvalRequest, request_evaluation
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from tests.browser.off_loop import off_the_loop
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.link.client import TrainerLink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

TOTAL = 1_000_000  # the streamed run never finishes on its own
PAUSE_S = 0.02  # 50 iterations a second, each a metrics batch and a progress message


class Streamer:
    """A trainer that is nothing but its link, reporting iterations as fast as told in a
    thread of its own until stopped."""

    def __init__(self, url: str, run: Run):
        self.link = TrainerLink(url, run.pk, make_run_token(run.pk))
        self.link.event("started")
        self.step = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._stream, daemon=True)

    def _stream(self) -> None:
        while not self._stop.is_set():
            self.step += 1
            values = {
                "rollout/success_rate": (self.step % 100) / 100,
                "counts/task0/episodes": 4.0,
                "counts/task0/successes": float(self.step % 5),
            }
            self.link.metrics(self.step, values)
            self.link.progress(self.step, TOTAL)
            time.sleep(PAUSE_S)

    def start(self) -> "Streamer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.link.close(timeout=30)


@pytest.fixture
def page(browser, web, settings):
    settings.ARMATURE_WEB_URL = web.url  # this process's broadcasts reach that server
    user = get_user_model().objects.create_user("rita", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    page = browser.new_page(viewport={"width": 1440, "height": 1000})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(web.url + "/login/")
    page.get_by_label("Username").fill("rita")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    page.web, page.user = web, user
    yield page
    page.close()
    assert not errors, errors


def live(page) -> None:
    expect(page.locator(".live-dot").first).to_be_visible()
    expect(page.locator(".live-dot:not(.on)")).to_have_count(0, timeout=15_000)


def updates_seen(page, selector: str, attribute: str, count: int) -> None:
    """Wait until the element's numeric `attribute` (re-rendered with each update) has
    moved `count` times past its present value."""
    first = int(page.locator(selector).get_attribute(attribute) or 0)
    wait_until(
        lambda: int(page.locator(selector).get_attribute(attribute) or 0) >= first + count,
        20, f"{count} updates of {selector}",
    )  # fmt: skip


def test_stop_stays_the_same_button_while_a_run_streams_and_one_click_stops_it(page):
    run = off_the_loop(submitted_run, "streaming")
    streamer = Streamer(page.web.url, run)
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    live(page)
    header = page.locator("#run-header")
    expect(header).to_have_attribute("data-state", "running", timeout=15_000)
    stop = page.get_by_role("button", name="Stop")
    stop.evaluate("button => { button.sameElement = true; }")
    streamer.start()
    try:
        updates_seen(page, "#run-header", "data-step", 20)  # the header, re-rendered 20 times
        assert stop.evaluate("button => button.sameElement === true"), "Stop was replaced"
        page.once("dialog", lambda dialog: dialog.accept())  # "Stop run N?"
        started = time.monotonic()
        stop.click(timeout=5_000)
        clicked_after = time.monotonic() - started
    finally:
        streamer.stop()
    # The click was made in the flood; what it sent is waited for once the flood is over,
    # which a web server beside the whole suite may take a while to work through. A lost
    # click is never recorded, however long the wait.
    wait_until(
        lambda: Run.objects.get(pk=run.pk).cancel_requested_at is not None,
        30, "the cancel to be recorded",
    )  # fmt: skip
    expect(header.locator(".badge", has_text="cancelling")).to_be_visible(timeout=30_000)
    assert clicked_after < 3, f"the click took {clicked_after:.1f} s"


def test_stop_on_a_quiet_run_shows_its_answer_at_once_and_stays(page):
    """Nothing else re-renders the header of a run that reports nothing: what Stop's
    answer holds (the run's page) gives it the "cancelling…" badge, and keeps Stop."""
    run = off_the_loop(submitted_run, "quiet")
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    live(page)
    page.once("dialog", lambda dialog: dialog.accept())
    page.get_by_role("button", name="Stop").click()
    header = page.locator("#run-header")
    expect(header.locator(".badge", has_text="cancelling")).to_be_visible(timeout=15_000)
    expect(header.get_by_role("button", name="Stop")).to_have_count(1)
    page.wait_for_timeout(500)  # what htmx does after the swap
    expect(header.get_by_role("button", name="Stop")).to_have_count(1)
    assert Run.objects.get(pk=run.pk).cancel_requested_at is not None


def test_the_runs_lists_tick_boxes_and_links_survive_row_updates(page):
    run = off_the_loop(submitted_run, "listed")
    streamer = Streamer(page.web.url, run)
    page.goto(f"{page.web.url}/runs/")
    live(page)
    row = page.locator(f"#run-row-{run.pk}")
    expect(row).to_have_attribute("data-state", "running", timeout=15_000)
    tick, link = row.locator(".compare-pick"), row.get_by_role("link", name=f"run {run.pk}")
    for control in (tick, link):
        control.evaluate("element => { element.sameElement = true; }")
    progress = row.locator("progress")
    streamer.start()
    try:
        first = int(progress.get_attribute("value"))
        wait_until(lambda: int(progress.get_attribute("value")) >= first + 20, 20, "row updates")
        for control in (tick, link):
            assert control.evaluate("element => element.sameElement === true"), control
        # A press and release that straddle a row's swap can make no click in Chromium
        # (as for a person, who clicks again): what must hold is the tick once made.
        wait_until(lambda: ticked(tick), 15, "a tick that takes")
        expect(page.get_by_role("button", name="Compare")).to_have_text("Compare (1)")
        wait_until(lambda: int(progress.get_attribute("value")) >= first + 40, 20, "row updates")
        expect(tick).to_be_checked()
        # A socket that opens again fetches the tables afresh; the run's row has changed
        # since, and is replaced, but not its controls.
        with page.expect_response(lambda response: response.url.endswith("/runs/")):
            page.evaluate("""() => document.querySelector("[ws-connect]").dispatchEvent(
                new CustomEvent("htmx:wsOpen", { bubbles: true }))""")
        page.wait_for_timeout(500)  # the fetched tables are put in after the response
        for control in (tick, link):
            assert control.evaluate("element => element.sameElement === true"), control
        expect(tick).to_be_checked()
    finally:
        streamer.stop()


def ticked(box) -> bool:
    try:
        box.check(timeout=3_000)
    except PlaywrightError:  # "Clicking the checkbox did not change its state"
        return False
    return True


def test_the_files_and_evaluations_cards_follow_the_run_without_a_reload(page):
    run = off_the_loop(submitted_run, "checkpointing")
    link = TrainerLink(page.web.url, run.pk, make_run_token(run.pk))
    link.event("started")
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    live(page)
    files, evaluations = page.locator("#run-files"), page.locator("#run-evaluations")
    expect(page.locator("#run-header")).to_have_attribute("data-state", "running", timeout=15_000)
    expect(files).to_contain_text("No files yet")
    expect(evaluations).to_contain_text("Evaluate becomes available once the run has saved")
    expect(page.locator("#evaluate-form")).to_have_count(0)
    page.evaluate("() => { window.sameDocument = true; }")

    def checkpoint(iteration: int) -> None:
        """What the trainer does: write the file, then say so over the link."""
        folder = artifacts.run_artifact_dir(run.pk) / "checkpoints"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"iter_{iteration}.pt"
        path.write_bytes(b"weights" * 100)
        link.event("checkpoint", {"iteration": iteration, "path": str(path)})

    checkpoint(5)
    expect(files.get_by_role("link", name="checkpoints/iter_5.pt")).to_be_visible(timeout=15_000)
    expect(files.locator('tr[data-path="checkpoints/iter_5.pt"] td[data-bytes]')).to_have_attribute(
        "data-bytes", "700"
    )  # fmt: skip
    form = page.locator("#evaluate-form")
    expect(form.get_by_role("button", name="Evaluate")).to_be_enabled()
    expect(form.get_by_label("Checkpoint")).to_have_value("5")

    # A second checkpoint re-renders the form: what was typed stays, the choice grows.
    form.get_by_label("Tasks").fill("0,1")
    checkpoint(10)
    expect(files.get_by_role("link", name="checkpoints/iter_10.pt")).to_be_visible(timeout=15_000)
    expect(form.get_by_label("Checkpoint").locator("option")).to_have_text(["iter 10", "iter 5"])
    expect(form.get_by_label("Checkpoint")).to_have_value("10")  # the newest, selected
    expect(form.get_by_label("Tasks")).to_have_value("0,1")
    # A checkpoint the user chose stays chosen when a newer one arrives.
    form.get_by_label("Checkpoint").select_option("5")
    checkpoint(15)
    expect(form.get_by_label("Checkpoint").locator("option")).to_have_text(
        ["iter 15", "iter 10", "iter 5"], timeout=15_000
    )
    expect(form.get_by_label("Checkpoint")).to_have_value("5")

    # An evaluation of it, moving on: its row shows on this page as it goes.
    request = EvalRequest(checkpoint=5)
    evaluation, _ = off_the_loop(lambda: request_evaluation(run, request, user=page.user))
    off_the_loop(transition, evaluation.pk, RunState.SUBMITTING)
    row = evaluations.locator(f'tr[data-run="{evaluation.pk}"]')
    expect(row).to_have_attribute("data-state", "submitting", timeout=15_000)
    off_the_loop(transition, evaluation.pk, RunState.RUNNING)
    expect(row).to_have_attribute("data-state", "running", timeout=15_000)
    assert page.evaluate("() => window.sameDocument === true"), "the page was reloaded"

    # The form that arrived live posts like one the page was rendered with.
    form.get_by_label("Checkpoint").select_option("10")
    form.get_by_role("button", name="Evaluate").click()
    expect(page.locator(".page-head h1")).to_contain_text("evaluation")
    assert Run.objects.filter(source_run=run, source_iteration=10).count() == 1
    link.close(timeout=30)
