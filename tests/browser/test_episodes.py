"""In Chromium: a finished built-in run's Episodes section plays its recorded videos
(the decoded picture changes from start to end), filters narrow the grid, the timeline
under a video shows where an operator took over and follows playback, a click on it
seeks, and an episode recorded while the page is open appears in it."""

import re

import pytest
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from controlplane.runs.artifacts import run_artifact_dir
from tests.browser.test_run_page import Feeder
from tests.episodes import STEPS, record_episodes
from tests.processes import wait_until
from tests.runs import submitted_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

SPECS = [
    {"name": "i1-t0-c0", "task": 0, "success": True},
    {"name": "i1-t0-c1", "task": 0, "success": False, "human": (6, 11)},
    {"name": "i2-t1-c0", "task": 1, "success": False, "iteration": 2},
]

# The video's picture now, as the page's own canvas draws it: mean RGB per 8×8 block.
PICTURE = """video => {
  const canvas = document.createElement("canvas");
  canvas.width = video.videoWidth; canvas.height = video.videoHeight;
  const context = canvas.getContext("2d");
  context.drawImage(video, 0, 0);
  return Array.from(context.getImageData(0, 0, canvas.width, canvas.height).data);
}"""


def seek(video, seconds: float) -> None:
    video.evaluate("""(v, t) => new Promise(done => {
        v.addEventListener("seeked", () => done(), {once: true}); v.currentTime = t; })""",
                   seconds)  # fmt: skip


def test_episodes_play_filter_show_the_takeover_and_arrive_live(operator_page):
    page = operator_page
    run = submitted_run("videos")
    feeder = Feeder(page.web.url, run)
    folder = run_artifact_dir(run.pk) / "videos"
    for record in record_episodes(folder, SPECS[:2]):
        feeder.link.event("episode", record)
    feeder.iterations(2)
    feeder.settled()
    page.goto(f"{page.web.url}/runs/{run.pk}/")
    section = page.locator("#run-episodes")
    cards = section.locator("figure.episode")
    expect(cards).to_have_count(2)
    expect(section.locator("#episodes-count")).to_have_text("2 episodes match.")

    # It plays, and the picture at its end is not the one at its start.
    video = page.locator("#episode-i1-t0-c0 video")
    wait_until(lambda: video.evaluate("v => v.readyState >= 2 && v.duration > 0"), 30,
               "the video's first frame")  # fmt: skip
    duration = video.evaluate("v => v.duration")
    assert duration == pytest.approx(STEPS / 10, abs=0.15)
    first = video.evaluate(PICTURE)
    seek(video, duration - 0.05)
    last = video.evaluate(PICTURE)
    assert sum(abs(a - b) for a, b in zip(first, last, strict=True)) / len(first) > 1
    video.evaluate("v => v.play()")
    wait_until(lambda: video.evaluate("v => v.currentTime > 0.3"), 15, "playback")

    # The takeover's steps, where they happened; the cursor follows playback and a
    # click on the timeline seeks.
    timeline = page.locator("#episode-i1-t0-c1 svg.episode-steps")
    human = timeline.locator("rect.segment-human")
    expect(human).to_have_attribute("x", "6")
    expect(human).to_have_attribute("width", "6")
    expect(page.locator("#episode-i1-t0-c1 figcaption")).to_contain_text("human 6")
    other = page.locator("#episode-i1-t0-c1 video")
    wait_until(lambda: other.evaluate("v => v.duration > 0"), 30, "the second video")
    box = timeline.bounding_box()
    timeline.click(position={"x": box["width"] * 0.75, "y": box["height"] / 2})
    wait_until(lambda: other.evaluate("v => v.currentTime > 0.6 * v.duration"), 10, "the seek")
    cursor = timeline.locator("rect.cursor")
    wait_until(lambda: abs(float(cursor.get_attribute("x")) - 0.75 * STEPS) < 1.5, 10,
               "the cursor at the seek")  # fmt: skip

    # Filters narrow the grid.
    section.get_by_label("Outcome").select_option("failure")
    expect(cards).to_have_count(1)
    expect(cards.first).to_have_id("episode-i1-t0-c1")
    section.get_by_label("Outcome").select_option("")
    section.get_by_label("Operator").select_option("0")
    expect(cards).to_have_count(1)
    expect(cards.first).to_have_id("episode-i1-t0-c0")
    section.get_by_label("Operator").select_option("")

    # A new episode appears while the page is open; a video under way stays where it is.
    expect(cards).to_have_count(2)
    video.evaluate("v => v.play()")
    wait_until(lambda: video.evaluate("v => v.currentTime > 0.3"), 15, "playback")
    paused_at = video.evaluate("v => { v.pause(); return v.currentTime; }")
    (record,) = record_episodes(folder / "later", SPECS[2:])
    (folder / "later" / "i2-t1-c0.mp4").rename(folder / "i2-t1-c0.mp4")
    feeder.link.event("episode", record)
    feeder.settled()
    expect(cards).to_have_count(3, timeout=20_000)
    expect(cards.first).to_have_id("episode-i2-t1-c0")
    assert video.evaluate("v => v.currentTime") == paused_at  # not reloaded by the refresh
    page.screenshot(path=str(page.web.log_dir / "episodes.png"), full_page=True)
    feeder.finish()


def test_compare_plays_two_runs_episodes_of_one_init_state_together(operator_page):
    page = operator_page
    runs = [submitted_run(name) for name in ("before", "after")]
    for index, run in enumerate(runs):
        feeder = Feeder(page.web.url, run)
        specs = [{"name": "i1-t0-c0", "task": 0, "init_state": 7, "success": bool(index)},
                 {"name": f"i1-t0-c1-{index}", "task": 0, "init_state": 20 + index,
                  "success": False}]  # fmt: skip
        for record in record_episodes(run_artifact_dir(run.pk) / "videos", specs):
            feeder.link.event("episode", record)
        feeder.iterations(1)
        feeder.settled()
        feeder.finish()
    page.goto(f"{page.web.url}/runs/compare/?ids={runs[0].pk},{runs[1].pk}")
    section = page.locator("#compare-episodes")
    # Only the init state both runs recorded is offered.
    expect(section.get_by_label("Task and init state").locator("option")).to_have_text(
        ["task 0 · init state 7"]
    )
    videos = section.locator("video")
    expect(videos).to_have_count(2)
    for run, video in zip(runs, videos.all(), strict=True):
        assert f"/runs/{run.pk}/episodes/i1-t0-c0.mp4" in video.get_attribute("src")
        wait_until(lambda v=video: v.evaluate("v => v.duration > 0"), 30, "a video's length")
    expect(section.locator("figcaption .outcome")).to_have_text(["failure", "success"])

    # A quarter of the speed: 8 s a video, so neither ends before Pause (a 2-core machine
    # under the whole suite can take seconds between two steps of a test).
    for video in videos.all():
        video.evaluate("v => { v.playbackRate = 0.25; }")
    section.get_by_role("button", name="Play both").click()
    for video in videos.all():
        wait_until(lambda v=video: v.evaluate("v => v.currentTime > 0.1"), 15, "both playing")
    section.get_by_role("button", name="Pause both").click()
    for video in videos.all():
        wait_until(lambda v=video: v.evaluate("v => v.paused"), 10, "both paused")
    slider = section.get_by_label("position in every video")
    slider.evaluate(
        "s => { s.value = '500'; s.dispatchEvent(new Event('input', {bubbles: true})); }"
    )
    middle = "v => Math.abs(v.currentTime / v.duration - 0.5) < 0.05"
    for video in videos.all():
        wait_until(lambda v=video: v.evaluate(middle), 10, "both at the middle")
    page.screenshot(path=str(page.web.log_dir / "compare-episodes.png"), full_page=True)


def test_an_eval_tables_cell_opens_its_episodes(operator_page):
    from controlplane.runs import artifacts
    from controlplane.runs.evaluations import EvalRequest, request_evaluation
    from controlplane.runs.models import Run, RunState
    from controlplane.runs.state import transition
    from controlplane.runs.tokens import make_run_token
    from trainer.evaluation.protocol import EvalTable, TaskResult
    from trainer.link.client import TrainerLink
    from trainer.link.reporter import eval_summary

    page = operator_page
    source = submitted_run("evaluated")
    (artifacts.run_artifact_dir(source.pk) / "checkpoints").mkdir(parents=True)
    (artifacts.run_artifact_dir(source.pk) / "checkpoints" / "iter_4.pt").write_bytes(b"w")
    rita = get_user_model().objects.get(username="rita")  # operator_page's user
    run, _ = request_evaluation(source, EvalRequest(checkpoint=4), user=rita)
    transition(run.pk, RunState.SUBMITTING)
    results = [TaskResult(task, f"task_{task}", 4, 1, {5: [1, 2], 10: [0, 2]}) for task in (0, 1)]
    table = EvalTable("builtin_reach", None, "iter_4.pt", 4, [5, 10], results).to_json()
    link = TrainerLink(page.web.url, run.pk, make_run_token(run.pk))
    link.event("started", {"mode": "eval"})
    specs = [{"name": f"eval-t{task}-h{h}-s0", "task": task, "horizon": h, "success": h == 5}
             for task in (0, 1) for h in (5, 10)]  # fmt: skip
    for record in record_episodes(artifacts.run_artifact_dir(run.pk) / "videos", specs):
        link.event("episode", record)
    link.event("evaluated", table)
    link.event("finished", {"summary": eval_summary(table)})
    link.close(timeout=30)
    wait_until(lambda: Run.objects.get(pk=run.pk).state == RunState.SUCCEEDED, 30, "the eval")

    page.goto(f"{page.web.url}/runs/{run.pk}/")
    expect(page.locator("#run-episodes figure.episode")).to_have_count(4)
    page.locator('#eval-table tr[data-task="1"] td.rate a').nth(1).click()  # task 1, H=10
    expect(page).to_have_url(re.compile(r"\?task=1&horizon=10#run-episodes$"))
    cards = page.locator("#run-episodes figure.episode")
    expect(cards).to_have_count(1)
    expect(cards.first).to_have_id("episode-eval-t1-h10-s0")
    expect(cards.first.locator("figcaption")).to_contain_text("h10")
