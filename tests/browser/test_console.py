"""In Chromium: an operator opens the console of a running RLPD run on the built-in env,
takes a simulated robot over (its gripper as it was), drives it with the keys, toggles
its gripper and releases it; the audit lists
the takeover, the learner's demo buffer holds exactly the intervened transitions, the
run's folder holds them as a LeRobot dataset, and the run page's intervention-rate
chart draws them."""

import pytest
from django.conf import settings
from playwright.sync_api import expect

from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import RunEvent, RunState
from tests.browser.operator_run import (
    BROWSER_DEADMAN_S,
    charted_intervention_rates,
    effector_js,
    free_direction,
    operator_run,
    robot_state,
    values,
    wait_for_the_runs_end,
)
from tests.processes import wait_until
from trainer.data.demos import load_demos

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(720),
    pytest.mark.embedded,
]

ITERATIONS = 12


@pytest.fixture
def running(browser, stack_factory, ray_head):
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    config = (settings.BASE_DIR / "examples/builtin_rlpd_console.yaml").read_text()
    # Its robots step in real time (env.interventions.real_time): 4 s an iteration, so
    # the run is still going when the operator drives. One update a step, not the
    # example's four: the learner keeps the robots' pace beside the whole suite.
    overrides = [
        f"runner.iterations={ITERATIONS}", f"env.interventions.deadman_s={BROWSER_DEADMAN_S}",
        "algorithm.rlpd.updates_per_step=1", "runner.videos.every=1",
    ]  # fmt: skip
    page, run = operator_run(browser, stack, "console-demo", config, "/runs/{run}/", overrides)
    page.stack = stack
    yield page, run
    page.close()


def test_an_operator_takes_over_drives_and_releases_and_the_learner_gets_it(running):
    page, run = running
    page.get_by_role("link", name="Open console").click()
    expect(page.get_by_role("heading", name=f"Console · run {run.pk}")).to_be_visible()
    # The trainer's robots come online once the run is going.
    expect(page.locator("#link-state")).to_have_text("live", timeout=180_000)
    expect(page.get_by_role("tab")).to_have_count(4)
    page.wait_for_function(
        "() => Number(document.getElementById('camera').dataset.frames || 0) > 5", timeout=60_000
    )
    expect(page.locator("#camera-note")).to_contain_text("top · 160×160")
    expect(page.locator("#camera-pick")).to_have_value("top")  # its one camera
    expect(page.locator("#rtt")).not_to_have_text("—")

    # Buttons that cannot act now are disabled, their title saying why.
    button = {op: page.locator(f'button[data-op="{op}"]') for op in
              ("take_over", "release", "request", "clear_stop", "estop")}  # fmt: skip
    expect(button["take_over"]).to_be_enabled()
    expect(button["estop"]).to_be_enabled()
    expect(button["release"]).to_be_disabled()
    expect(button["release"]).to_have_attribute("title", "you hold no robot to release")
    expect(button["request"]).to_have_attribute("title", "nobody else holds this robot")
    expect(button["clear_stop"]).to_be_disabled()
    expect(button["clear_stop"]).to_have_attribute("title", "the robot is not stopped")
    expect(page.locator(".camera-legend")).to_contain_text("ringed in white")

    # Round trips to the robots beside the whole suite on a 2-core machine: seconds.
    page.keyboard.press("t")
    expect(page.locator("#mode")).to_have_text("human", timeout=30_000)
    expect(page.locator("#holder")).to_have_text("olga")
    expect(button["take_over"]).to_have_attribute("title", "you hold this robot")
    expect(button["release"]).to_be_enabled()
    page.screenshot(path=str(page.stack.log_dir / "console.png"), full_page=True)
    state = robot_state(page)  # held still: a zero action until a key is down
    axis, sign = free_direction(state)
    key = {(0, 1): "d", (0, -1): "a", (1, 1): "w", (1, -1): "s"}[axis, sign]
    page.keyboard.down(key)
    wanted = ["0.00", "0.00", "0.00"]
    wanted[axis] = f"{sign:.2f}"
    expect(page.locator("#your-action")).to_contain_text(" ".join(wanted))
    start = state["effector"][axis]
    # Several real-time env steps of the held key: seconds alone, up to a minute beside
    # the whole suite on a 2-core machine.
    page.wait_for_function(f"() => {sign} * ({effector_js(axis)} - {start}) > 0.2", timeout=60_000)
    # The episode's timeline shows the operator's steps as they are taken.
    expect(page.locator("#episode-timeline .segment-human").first).to_be_attached()
    expect(page.locator("#episode-timeline-note")).to_contain_text("human")
    page.keyboard.up(key)
    expect(page.locator("#applied-latency")).not_to_have_text("—")
    # Taking over and driving never moved the gripper; the page shows it as it is, and
    # only the operator's G changes it.
    grip = robot_state(page)["gripper"][0]
    assert grip == state["gripper"][0]
    expect(page.locator("#gripper")).to_have_text("closed" if grip else "open")
    page.keyboard.press("g")
    expect(page.locator("#gripper")).to_have_text("open" if grip else "closed")
    wait_until(lambda: robot_state(page)["gripper"][0] != grip, 30, "the gripper to toggle", 0.1)
    page.evaluate(
        """window.testPads = [{id: "Test pad", connected: true, axes: [0, -1, 0, 0],
                               buttons: [{pressed: false}]}]"""
    )  # the left stick pushed forward: +y
    expect(page.locator("#gamepad")).to_have_text("gamepad: Test pad")
    expect(page.locator("#your-action")).to_contain_text("0.00 1.00 0.00")
    page.evaluate("window.testPads = []")
    page.keyboard.press("y")
    expect(page.locator("#mode")).to_have_text("policy", timeout=30_000)
    # A release the robot carried out shows no error (commands on their way when it
    # landed are refused, and not shown).
    page.wait_for_timeout(1000)
    expect(page.locator("#console-error")).to_be_hidden()
    expect(button["release"]).to_be_disabled()

    # 12 real-time iterations: about a minute alone, about five beside the whole suite
    # on a 2-core CI machine.
    wait_for_the_runs_end(run, 540)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    (takeover,) = RunEvent.objects.filter(run=run, kind="takeover")
    assert takeover.data["operator"] == "olga" and takeover.data["reason"] == "released"
    assert takeover.data["robot_name"] == "sim-0"

    # Every intervened transition went into the demo buffer, and nothing else did.
    intervened = values(run, "interventions/steps")
    assert len(intervened) == ITERATIONS and sum(intervened) > 0
    assert values(run, "buffers/demo")[-1] == sum(intervened)
    assert sum(intervened) <= takeover.data["steps"]
    # ... and the run's folder keeps them as a LeRobot dataset, a demo source for SFT.
    recorded = load_demos(run_artifact_dir(run.pk) / "interventions")
    assert len(recorded["action"]) == sum(intervened) and recorded["intervened"].all()

    page.goto(f"{page.stack.url}/console/audit/")
    row = page.locator("#takeovers tbody tr").first
    expect(row).to_contain_text("olga")
    expect(row).to_contain_text("sim-0")
    expect(row).to_contain_text("released")

    page.goto(f"{page.stack.url}/runs/{run.pk}/")
    rates = charted_intervention_rates(page, ITERATIONS)
    assert rates == pytest.approx(values(run, "interventions/rate")) and max(rates) > 0
    # The run recorded the episode the operator drove (episodes a human acted in come
    # first): its card's step bar shows the human steps where they were taken.
    episodes = [event.data for event in RunEvent.objects.filter(run=run, kind="episode")]
    driven = next(episode for episode in episodes if episode["human_steps"])
    card = page.locator(f"#episode-{driven['name']}")
    expect(card.locator("figcaption")).to_contain_text(f"human {driven['human_steps']}")
    first = driven["actors"].index("human")
    expect(card.locator("rect.segment-human").first).to_have_attribute("x", str(first))
