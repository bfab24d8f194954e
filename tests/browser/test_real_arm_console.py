"""In Chromium: an RLPD run on a real arm (`env.name: real_robot`) against a fake SERL
robot server and a fake camera (an MJPEG stream and a snapshot endpoint). The operator
picks a camera, takes the arm over, drives it, marks a success and releases it; every
pose the server was sent lies in the safety box; the server dies and comes back, and the
run reports it, recovers and finishes, its interventions recorded as a dataset."""

import time

import pytest
import yaml
from playwright.sync_api import expect

from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import Run, RunEvent, RunState
from tests.browser.operator_run import operator_run
from tests.processes import wait_until
from tests.trainer.hardware.fake_camera import FakeCamera
from tests.trainer.hardware.fake_serl_server import FakeSerlServer
from trainer.data.demos import load_demos
from trainer.hardware.serl_franka import SafetyBox

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(500)]

BOX = {"xyz_low": [0.4, -0.1, 0.05], "xyz_high": [0.6, 0.1, 0.3],
       "rpy_low": [2.8, -0.3, -0.5], "rpy_high": [3.1416, 0.3, 0.5]}  # fmt: skip
ITERATIONS = 8


def arm_config(server: FakeSerlServer, camera: FakeCamera) -> str:
    document = {
        "name": "real-arm",
        "env": {
            "name": "real_robot", "num_parallel_envs": 1, "max_episode_steps": 40,
            "real_robot": {"task": "reach the far corner", "reconnect_s": 60, "robots": [{
                "name": "franka-0", "url": server.url, "safety_box": BOX,
                "action_scale": [0.02, 0.1, 1.0], "control_hz": 10, "timeout_s": 2.0,
                "reset_pose": [0.5, 0.0, 0.2, 1.0, 0.0, 0.0, 0.0],
                "cameras": [{"name": "wrist", "url": camera.url("stream")},
                            {"name": "front", "url": camera.url("snapshot")}],
            }]},
            # The deadman is 1 s here: a headless browser on a busy CI machine can miss
            # its 25 ms heartbeats for longer than the default 0.15 s.
            "interventions": {"source": "console", "deadman_s": 1.0, "control_hz": 10,
                              "on_link_loss": "release"},
        },
        "algorithm": {"name": "rlpd", "rlpd": {"batch_size": 32, "training_starts": 20,
                                               "hidden_sizes": [32, 32]}},
        "runner": {"iterations": ITERATIONS, "seed": 0, "checkpoint_every": 4,
                   "torch_threads": 1},
    }  # fmt: skip
    return yaml.safe_dump(document, sort_keys=False)


@pytest.fixture
def arm():
    server, camera = FakeSerlServer().start(), FakeCamera(fps=15)
    yield server, camera
    server.stop()
    camera.stop()


def test_an_operator_drives_a_real_arm_and_the_run_survives_its_server_dying(
    browser, stack_factory, ray_head, arm
):
    server, camera = arm
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()
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
        wait_until(lambda: Run.objects.get(pk=run.pk).is_final, 300, "the run's end", 0.5)
    finally:
        page.close()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    (recovered,) = RunEvent.objects.filter(run=run, kind="recovered")
    assert "franka-0" in recovered.data["what"] and "reached again" in recovered.data["what"]
    (takeover,) = RunEvent.objects.filter(run=run, kind="takeover")
    assert takeover.data["operator"] == "olga" and takeover.data["robot_name"] == "franka-0"
    box = SafetyBox(*(tuple(BOX[key]) for key in ("xyz_low", "xyz_high", "rpy_low",
                                                  "rpy_high")))  # fmt: skip
    assert server.posed() and all(box.holds(pose) for pose in server.posed())
    recorded = load_demos(run_artifact_dir(run.pk) / "interventions")
    assert len(recorded["action"]) > 0 and recorded["intervened"].all()
    assert (recorded["action"][:, 0] > 0).any()  # the operator's +x
