"""In Chromium: a cluster's page shows Ray's live nodes beside its YAML, with their
labels and CPUs, the active runs' processes on them, and the node the YAML declares
that Ray lacks; and says so when Ray cannot be read."""

import pytest
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from playwright.sync_api import expect

from controlplane.inventory.services import import_cluster_yaml
from controlplane.runs.models import RunEvent, RunState
from controlplane.runs.state import transition
from tests.runs import submitted_run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def log_in(browser, stack):
    get_user_model().objects.create_user("ada", password="pw-for-tests")
    page = browser.new_page(viewport={"width": 1440, "height": 900})
    page.goto(stack.url + "/login/")
    page.get_by_label("Username").fill("ada")
    page.get_by_label("Password").fill("pw-for-tests")
    page.get_by_role("button", name="Log in").click()
    expect(page.get_by_role("heading", name="Home")).to_be_visible()
    return page


def head_address(ray_head) -> str:
    nodes = requests.get(f"{ray_head.url}/api/v0/nodes?detail=1", timeout=30).json()
    (head,) = [n for n in nodes["data"]["result"]["result"] if n["state"] == "ALIVE"]
    return head["node_ip"]


def test_the_cluster_page_shows_rays_nodes_runs_and_what_is_missing(browser, stack_factory,
                                                                      ray_head):  # fmt: skip
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_web()
    import_cluster_yaml("lab", (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text())
    run = submitted_run("on-the-head")
    transition(run.pk, RunState.RUNNING)
    ip = head_address(ray_head)
    RunEvent.objects.create(run=run, kind="placed", data={"processes": [
        {"component": "actor", "rank": 0, "node_rank": 0, "node_ip": ip, "pid": 4242},
    ]})  # fmt: skip
    page = log_in(browser, stack)
    page.goto(stack.url + "/cluster/lab/")

    head = page.locator('#live-nodes tr[data-rank="0"]')
    expect(head).to_contain_text("node 0 (head)")
    expect(head).to_contain_text(ip)
    expect(head).to_contain_text("node-rank=0")
    expect(head).to_contain_text("0 of 2")  # the test head's 2 CPUs, no actor holds any
    expect(head).to_contain_text(f"run {run.pk} · actor 0 pid 4242")
    expect(head.get_by_role("link", name=f"run {run.pk}")).to_have_attribute(
        "href", f"/runs/{run.pk}/"
    )
    missing = page.locator('#live-nodes tr.missing[data-rank="1"]')
    expect(missing).to_contain_text("missing: the YAML declares it (robot)")
    expect(missing).to_contain_text("./armature join <head> --node-rank 1")
    page.screenshot(path=str(stack.log_dir / "cluster-live.png"), full_page=True)

    # Live: the run ends, and its process leaves the node at the next refresh.
    transition(run.pk, RunState.SUCCEEDED)
    expect(head).not_to_contain_text(f"run {run.pk}", timeout=15_000)
    page.close()


def test_the_cluster_page_says_when_ray_cannot_be_read(browser, stack_factory):
    stack = stack_factory(RAY_ADDRESS="http://127.0.0.1:9")  # discard: nothing answers
    stack.start_web()
    import_cluster_yaml("lab", (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text())
    page = log_in(browser, stack)
    page.goto(stack.url + "/cluster/lab/")
    expect(page.locator("#live-cluster [role=alert]")).to_contain_text(
        "Ray at http://127.0.0.1:9 could not be read"
    )
    expect(page.get_by_role("heading", name="Node groups")).to_be_visible()  # the YAML's part
    page.close()
