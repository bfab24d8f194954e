"""In Chromium: an RLPD run on a real arm (`env.name: real_robot`) against a fake SERL
robot server and a fake camera (an MJPEG stream and a snapshot endpoint). The operator
picks a camera, takes the arm over, drives it, marks a success and releases it; every
pose the server was sent lies in the safety box; the server dies and comes back, and the
run reports it, recovers and finishes, its interventions recorded as a dataset."""

import time

import pytest
from playwright.sync_api import expect

from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import RunEvent, RunState
from tests.browser.operator_run import operator_run, wait_for_the_runs_end
from tests.browser.real_arm import BOX, arm_config, declare_arm
from tests.processes import wait_until
from trainer.data.demos import load_demos
from trainer.hardware.serl_franka import SafetyBox

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(500),
]


def test_an_operator_drives_a_real_arm_and_the_run_survives_its_server_dying(
    browser, stack_factory, ray_head, arm
):
    server, camera = arm
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
    declare_arm(server, camera)
    page, run = operator_run(browser, stack, "real-arm", arm_config(server, camera),
                             "/console/runs/{run}/")  # fmt: skip
    try:
        expect(page.locator("#link-state")).to_have_text("live", timeout=180_000)
        expect(page.get_by_role("tab")).to_have_text("franka-0 · policy")
        # Both cameras are offered; the wrist stream shows first, then the one picked.
        pick = page.locator("#camera-pick")
        expect(pick.locator("option")).to_have_text(["wrist", "front"])
        expect(page.locator("#camera-note")).to_contain_text("wrist · 32×32")
        pick.select_option("front")
        expect(page.locator("#camera-note")).to_contain_text("front · 32×32", timeout=10_000)

        page.keyboard.press("t")
        expect(page.locator("#mode")).to_have_text("human")
        start = server.pose[0]
        page.keyboard.down("d")  # +x, toward the box's far side
        wait_until(lambda: server.pose[0] > start + 0.04, 30, "the arm to move", 0.1)
        page.keyboard.up("d")
        page.keyboard.press("1")  # success
        expect(page.locator("#last-success")).to_have_text("success", timeout=15_000)
        page.keyboard.press("y")
        expect(page.locator("#mode")).to_have_text("policy")

        server.stop()  # the arm's server dies under the run ...
        time.sleep(3)
        server.start()  # ... and comes back on the same port
        wait_for_the_runs_end(run, 300)
    finally:
        page.close()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    # At least once: on a loaded machine a slow reply may cost the link a second time.
    recovered = [e.data["what"] for e in RunEvent.objects.filter(run=run, kind="recovered")]
    assert any("franka-0" in what and "reached again" in what for what in recovered), recovered
    (takeover,) = RunEvent.objects.filter(run=run, kind="takeover")
    assert takeover.data["operator"] == "olga" and takeover.data["robot_name"] == "franka-0"
    box = SafetyBox(*(tuple(BOX[key]) for key in ("xyz_low", "xyz_high", "rpy_low",
                                                  "rpy_high")))  # fmt: skip
    assert server.posed() and all(box.holds(pose) for pose in server.posed())
    recorded = load_demos(run_artifact_dir(run.pk) / "interventions")
    assert len(recorded["action"]) > 0 and recorded["intervened"].all()
    assert (recorded["action"][:, 0] > 0).any()  # the operator's +x
