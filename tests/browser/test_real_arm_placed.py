"""In Chromium: the real-arm console test's run in seed 004's layout. The arm's env worker
sits on a robot node (Ray node 1, joined to the head as `./armature join` joins one) and
the learner on node 0: the worker reaches the console over a robot link of its own. The
operator takes the arm over, drives it, marks a success and releases it; every pose the
server was sent lies in the safety box; the server dies and comes back, and the worker
reports it, reaches the arm again and the run finishes, its interventions recorded."""

import time

import pytest
import yaml
from playwright.sync_api import expect

from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import RunEvent, RunState
from tests.browser.operator_run import operator_run, wait_for_the_runs_end
from tests.browser.real_arm import BOX, arm_config, declare_arm
from tests.processes import wait_until
from tests.stack import RayHead, RayNode
from trainer.data.demos import load_demos
from trainer.hardware.serl_franka import SafetyBox

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600)]


@pytest.fixture
def robot_node_cluster(tmp_path):
    """A Ray head (node 0) and a robot node (node 1) of this test's own."""
    head = RayHead(tmp_path)
    node = None
    try:
        node = RayNode(head, 1, tmp_path)
        yield head
    finally:
        if node is not None:
            node.close()
        head.close()


def test_an_operator_drives_an_arm_whose_worker_is_on_the_robot_node(
    browser, stack_factory, robot_node_cluster, arm
):
    server, camera = arm
    document = yaml.safe_load(arm_config(server, camera))
    document["cluster"] = {"num_nodes": 2, "component_placement": {"actor": "0", "env": "1"}}
    stack = stack_factory(RAY_ADDRESS=robot_node_cluster.url)
    stack.start_worker()
    stack.start_web()
    declare_arm(server, camera)
    page, run = operator_run(browser, stack, "real-arm-placed",
                             yaml.safe_dump(document, sort_keys=False),
                             "/console/runs/{run}/")  # fmt: skip
    try:
        expect(page.locator("#link-state")).to_have_text("live", timeout=240_000)
        expect(page.get_by_role("tab")).to_have_text("franka-0 · policy")
        expect(page.locator("#camera-note")).to_contain_text("wrist · 32×32")

        page.keyboard.press("t")
        expect(page.locator("#mode")).to_have_text("human")
        start = server.pose[0]
        page.keyboard.down("d")  # +x, toward the box's far side
        # The worker steps at 10 Hz when the machine lets it; beside the whole suite on
        # 2 cores a step has taken seconds, so the wait is generous.
        wait_until(lambda: server.pose[0] > start + 0.04, 90, "the arm to move", 0.1)
        page.keyboard.up("d")
        page.keyboard.press("1")  # success
        expect(page.locator("#last-success")).to_have_text("success", timeout=15_000)
        page.keyboard.press("y")
        expect(page.locator("#mode")).to_have_text("policy")

        server.stop()  # the arm's server dies under the run ...
        time.sleep(3)
        server.start()  # ... and comes back on the same port
        wait_for_the_runs_end(run, 400)
    finally:
        page.close()
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    (placed,) = RunEvent.objects.filter(run=run, kind="placed")
    where = {(p["component"], p["rank"]): p["node_rank"] for p in placed.data["processes"]}
    assert where == {("actor", 0): 0, ("env", 0): 1}  # the arm's worker on the robot node
    # The outage is one recovery at least; an answer slower than the arm's timeout beside
    # the whole suite is a lost link too, and recovered the same way.
    recovered = [event.data["what"] for event in RunEvent.objects.filter(run=run, kind="recovered")]
    assert recovered and all(
        what.startswith("env worker 0: ") and "franka-0 reached again" in what for what in recovered
    ), recovered
    (takeover,) = RunEvent.objects.filter(run=run, kind="takeover")
    assert takeover.data["operator"] == "olga" and takeover.data["robot_name"] == "franka-0"
    box = SafetyBox(*(tuple(BOX[key]) for key in ("xyz_low", "xyz_high", "rpy_low",
                                                  "rpy_high")))  # fmt: skip
    assert server.posed() and all(box.holds(pose) for pose in server.posed())
    recorded = load_demos(run_artifact_dir(run.pk) / "interventions")
    assert len(recorded["action"]) > 0 and recorded["intervened"].all()
    assert (recorded["action"][:, 0] > 0).any()  # the operator's +x
