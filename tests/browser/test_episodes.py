"""In Chromium: a finished built-in run's Episodes section plays its recorded videos
(the decoded picture changes from start to end), filters narrow the grid, the timeline
under a video shows where an operator took over and follows playback, a click on it
seeks, and an episode recorded while the page is open appears in it."""

import pytest
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
    cursor = float(timeline.locator("rect.cursor").get_attribute("x"))
    assert cursor == pytest.approx(0.75 * STEPS, abs=1.5)

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
