"""In Chromium: the run page's log panel on a real Ray job's log, as a person reads it:
full width, Ray's colours as colours (no raw `[36m`), a line count, a search that marks
every hit, and a view that follows the newest line until the reader scrolls up."""

import random
import sys

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from playwright.sync_api import expect
from ray.job_submission import JobStatus, JobSubmissionClient

from controlplane.experiments.services import create_experiment
from controlplane.runs.models import Run
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
LINES = 150
RUN_PK = random.randrange(10**8, 10**9)
JOB = (
    f"for i in range({LINES}):\n"
    "    print(f'\\x1b[36m(ActorRank pid=4242)\\x1b[0m iteration {i} loss 0.5')\n"
    "print('\\x1b[1;31mERROR\\x1b[0m the env worker died')\n"
)


@pytest.fixture
def page(browser, stack_factory, ray_head, tmp_path):
    script = tmp_path / "print_colours.py"
    script.write_text(JOB)
    jobs = JobSubmissionClient(ray_head.url, headers=ray_head.headers)
    submission = f"armature-run-{RUN_PK}"
    jobs.submit_job(entrypoint=f"{sys.executable} {script}", submission_id=submission)
    wait_until(lambda: jobs.get_job_status(submission).is_terminal(), 180, "the job to end")
    assert jobs.get_job_status(submission) == JobStatus.SUCCEEDED
    experiment = create_experiment("coloured", CONFIG)
    Run.objects.create(pk=RUN_PK, experiment=experiment, revision=experiment.latest_revision,
                       config_yaml=CONFIG, ray_job_id=submission)  # fmt: skip
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_web()
    user = get_user_model().objects.create_user("vera", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="viewer")[0])
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{stack.url}/login/?next=/runs/{RUN_PK}/")
    page.get_by_label("Username").fill("vera")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    yield page
    page.close()
    assert not errors, errors


def test_the_log_panel_shows_colours_counts_lines_searches_and_follows(page):
    logs = page.locator("#run-logs")
    expect(logs).to_contain_text("the env worker died", timeout=30_000)
    assert "[36m" not in logs.text_content() and "\x1b" not in logs.text_content()
    prefix = logs.locator("span.ansi36").first
    expect(prefix).to_have_text("(ActorRank pid=4242)")
    # Read in one go in the page: a poll may replace the <pre> between two calls.
    colour = """() => { const e = document.querySelector('#run-logs span.ansi36');
                       return e ? getComputedStyle(e).color : null; }"""
    wait_until(lambda: page.evaluate(colour) == "rgb(102, 217, 232)", 10, "the prefix's colour")
    expect(logs.locator("span.ansi31")).to_have_text("ERROR")
    shown = int(logs.get_attribute("data-lines"))
    assert shown >= LINES + 1  # the job's lines and Ray's own
    expect(page.locator("[data-log-count]")).to_have_text(f"· {shown} lines")
    panel, beside = page.locator("#log-panel").bounding_box(), page.locator(".split").bounding_box()
    assert panel["width"] >= beside["width"] - 1  # the page's whole width, not half of it

    # Following: the newest line is in view; it stays so across the next polls.
    at_end = "e => e.scrollTop + e.clientHeight >= e.scrollHeight - 4"
    wait_until(lambda: logs.evaluate(at_end), 10, "the view at the last line")
    page.get_by_label("search the log", exact=True).fill("ITERATION 14")  # any case
    expect(page.locator("[data-log-matches]")).to_have_text("11 matches")  # 14, 140-149
    expect(logs.locator("mark")).to_have_count(11)
    expect(logs.locator("mark").first).to_have_text("iteration 14")
    page.wait_for_timeout(3500)  # a poll re-renders the lines: the marks come back
    expect(logs.locator("mark")).to_have_count(11)

    logs.evaluate("e => { e.scrollTop = 0; e.dispatchEvent(new Event('scroll')); }")
    expect(page.get_by_label("follow")).not_to_be_checked()  # reading up stops following
    page.wait_for_timeout(3500)
    assert logs.evaluate("e => e.scrollTop") == 0  # the next poll left the reader there
