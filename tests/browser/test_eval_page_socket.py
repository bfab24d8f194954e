"""In Chromium: an eval run's page, which has no charts, gets only htmx fragments over its
socket while its trainer reports metrics and progress, and the pages' own script drops
any JSON frame a socket sends to a page without a script that takes it."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect

from controlplane.runs import artifacts
from controlplane.runs.evaluations import EvalRequest, request_evaluation
from controlplane.runs.models import RunState
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.link.client import TrainerLink

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

# Whether a socket message reaches htmx's swap (false: a listener cancelled it).
SWAPPED = """text => htmx.trigger(document.querySelector("[ws-connect]"),
  "htmx:wsBeforeMessage", {message: text})"""


@pytest.fixture
def page(browser, web, settings):
    settings.ARMATURE_WEB_URL = web.url  # this process's broadcasts reach that server
    user = get_user_model().objects.create_user("olga", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    source = submitted_run("evaluated")
    folder = artifacts.run_artifact_dir(source.pk) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "iter_4.pt").write_bytes(b"weights")
    run, _ = request_evaluation(source, EvalRequest(checkpoint=4), user=user)
    transition(run.pk, RunState.SUBMITTING)
    page = browser.new_page()
    page.goto(f"{web.url}/login/?next=/runs/{run.pk}/")
    page.get_by_label("Username").fill("olga")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    # Landed on the run's page: a reload while the login still navigates has no page.
    expect(page.locator("#run-header")).to_be_visible()
    page.web, page.run = web, run
    yield page
    page.close()


def test_an_eval_runs_page_gets_no_json_frame_and_drops_any(page):
    frames: list[str | bytes] = []

    def watch(socket) -> None:
        if f"/ws/runs/{page.run.pk}/" in socket.url:
            socket.on("framereceived", lambda payload: frames.append(payload))

    page.on("websocket", watch)
    page.reload()
    expect(page.locator(".live-dot.on")).to_have_count(1, timeout=15_000)

    link = TrainerLink(page.web.url, page.run.pk, make_run_token(page.run.pk))
    link.event("started", {"mode": "eval"})
    for step in (1, 2):
        link.metrics(step, {"eval/success_rate": step / 4})
        link.progress(step, 4)
    wait_until(lambda: link.pending() == 0, 30, "the link's acknowledgements")
    link.close(timeout=30)

    header = page.locator("#run-header")
    expect(header).to_have_attribute("data-state", "running")
    expect(header).to_have_attribute("data-step", "2")
    assert frames, "the page's socket sent nothing"
    assert all(isinstance(f, str) and f.startswith("<") for f in frames), frames
    assert '"type"' not in page.locator("body").inner_text()

    # Were one sent anyway, htmx would not get it; fragments still reach it.
    assert page.evaluate(SWAPPED, '{"type": "progress", "run": 1, "step": 3}') is False
    assert page.evaluate(SWAPPED, '<div id="nothing-here"></div>') is True
