"""The CI client against a real control plane: daphne + a Celery worker + a Ray head;
the run is `python -m trainer run` on the built-in env as a Ray job."""

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.api.tokens import create_token
from controlplane.runs.models import Run

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(400)]

CONFIG = settings.BASE_DIR / "examples/builtin_ppo.yaml"


@pytest.fixture
def live(stack_factory, ray_head, settings) -> tuple[str, str]:
    settings.RAY_ADDRESS = ray_head.url
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    url = stack.start_web()
    stack.start_worker()
    admin = get_user_model().objects.create_user("ci-admin")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    _, token = create_token(admin, "CI")
    return url, token


def client(url: str, token: str, tmp_path, gate: str, *more: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "ARMATURE_"))}
    command = [
        sys.executable, "-m", "controlplane.client", "submit", str(CONFIG),
        "--url", url, "--set", "runner.iterations=3", "--wait", "--require", gate,
        "--idempotency-key", "live-test-1", "--poll-interval", "0.5",
        "--json-out", str(tmp_path / f"{gate}.json"), "--junit-out", str(tmp_path / f"{gate}.xml"),
        *more,
    ]  # fmt: skip
    return subprocess.run(
        command, cwd=settings.BASE_DIR, env={**env, "ARMATURE_TOKEN": token},
        capture_output=True, text=True, timeout=360,
    )  # fmt: skip


def test_the_client_launches_waits_and_gates_on_a_real_run(live, tmp_path):
    url, token = live
    done = client(url, token, tmp_path, "success_rate>=0.0")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "experiment builtin-ppo: revision 1 (created)" in done.stdout
    assert "step 3/3 (100%)" in done.stdout
    summary = json.loads((tmp_path / "success_rate>=0.0.json").read_text())
    assert summary["state"] == "succeeded"
    assert summary["gates"][0]["metric_key"] == "rollout/success_rate"
    assert summary["gates"][0]["passed"] is True
    suite = ET.parse(tmp_path / "success_rate>=0.0.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("2", "0", "0")

    # The same idempotency key: the finished run is reused, not launched again, and a
    # gate it cannot meet fails with the gate's exit code.
    # Its episode videos are saved for the CI job's artifacts.
    missed = client(url, token, tmp_path, "success_rate>=1.01", "--episodes", str(tmp_path / "ep"))
    assert missed.returncode == 3, missed.stdout + missed.stderr
    listed = json.loads((tmp_path / "ep" / "episodes.json").read_text())
    assert len(listed) == 2 and all(e["iteration"] == 1 for e in listed)  # the example's
    for episode in listed:
        assert (tmp_path / "ep" / episode["file"]).read_bytes()[4:8] == b"ftyp"
    assert f"saved 2 episode video(s) of run {summary['run_id']}" in missed.stdout
    assert "(unchanged)" in missed.stdout
    assert "already launched with this idempotency key" in missed.stdout
    failed = json.loads((tmp_path / "success_rate>=1.01.json").read_text())
    assert (failed["status"], failed["run_id"]) == ("gate_failed", summary["run_id"])
    assert Run.objects.count() == 1
    suite = ET.parse(tmp_path / "success_rate>=1.01.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "1")
