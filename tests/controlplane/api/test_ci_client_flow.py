"""The CI client end to end against a stand-in control plane (a stdlib HTTP server that
speaks the REST contract), run as a subprocess in which importing Django fails."""

import io
import json
import subprocess
import sys
import threading
import xml.etree.ElementTree as ET
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from django.conf import settings

from controlplane.client.gates import parse_gate
from controlplane.client.submit import SubmitOptions, submit

pytestmark = pytest.mark.embedded

TOKEN = "arm_testpfx_secret"
# Runs the client like `python -m controlplane.client`, with Django made unimportable:
# the client must work on a CI machine that has never installed it.
NO_DJANGO = """
import runpy, sys

class NoDjango:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("django", "rest_framework", "celery", "channels", "yaml"):
            raise ImportError(f"{name} is blocked in this test")
sys.meta_path.insert(0, NoDjango())
sys.argv[0] = "controlplane.client"
runpy.run_module("controlplane.client", run_name="__main__", alter_sys=True)
"""


class FakeControlPlane:
    """Experiments and one run whose successive GETs walk through `states`."""

    def __init__(self, states: list[dict], experiment_exists: bool = False):
        self.states = states
        self.experiments = {"builtin-ppo": 1} if experiment_exists else {}
        self.requests: list[dict] = []
        self.polls = 0
        self.create_errors: dict | None = None
        self.cancelled = False
        plane = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                plane.handle(self, "GET")

            def do_POST(self) -> None:
                plane.handle(self, "POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def run(self) -> dict:
        state = self.states[min(self.polls, len(self.states) - 1)]
        if self.cancelled:
            state = {**state, "state": "cancelled"}
        return {"id": 7, "experiment": "builtin-ppo", "revision": 2, "exit_reason": "",
                "progress_step": 0, "progress_total": 3, "summary": {}, "ray_job_id": "",
                **state}  # fmt: skip

    def handle(self, request: BaseHTTPRequestHandler, method: str) -> None:
        length = int(request.headers.get("Content-Length") or 0)
        body = json.loads(request.rfile.read(length)) if length else None
        path = request.path
        self.requests.append({"method": method, "path": path, "body": body,
                              "headers": dict(request.headers)})  # fmt: skip
        status, answer = self.route(method, path, body, request.headers)
        data = json.dumps(answer).encode()
        request.send_response(status)
        request.send_header("Content-Type", "application/json")
        request.send_header("Content-Length", str(len(data)))
        request.end_headers()
        request.wfile.write(data)

    def route(self, method: str, path: str, body: dict | None, headers) -> tuple[int, dict]:
        if headers.get("Authorization") != f"Bearer {TOKEN}":
            return 401, {"detail": "Unknown API token."}
        if (method, path) == ("GET", "/api/v1/experiments/builtin-ppo"):
            if "builtin-ppo" not in self.experiments:
                return 404, {"detail": "No Experiment matches the given query."}
            return 200, {"name": "builtin-ppo", "latest_revision": {"number": 1}}
        if (method, path) == ("POST", "/api/v1/experiments"):
            if self.create_errors:
                return 400, self.create_errors
            self.experiments[body["name"]] = 1
            return 201, {"name": body["name"], "latest_revision": {"number": 1}}
        if (method, path) == ("POST", "/api/v1/experiments/builtin-ppo/revisions"):
            return 201, {"number": 2, "config_yaml": body["config_yaml"]}
        if (method, path) == ("POST", "/api/v1/runs"):
            return 201, {**self.run(), "state": "queued"}
        if (method, path) == ("GET", "/api/v1/runs/7"):
            self.polls += 1
            return 200, self.run()
        if (method, path) == ("POST", "/api/v1/runs/7/cancel"):
            self.cancelled = True
            return 202, self.run()
        return 404, {"detail": "Not found."}


@pytest.fixture
def plane_factory():
    planes: list[FakeControlPlane] = []

    def make(states: list[dict], **kwargs: object) -> FakeControlPlane:
        planes.append(FakeControlPlane(states, **kwargs))
        return planes[-1]

    yield make
    for plane in planes:
        plane.close()


def run_client(plane: FakeControlPlane, tmp_path: Path, *args: str, env: dict | None = None):
    config = tmp_path / "exp.yaml"
    config.write_text("name: builtin-ppo\nrunner:\n  iterations: 3\n")
    command = [sys.executable, "-c", NO_DJANGO, "submit", str(config), "--url", plane.url,
               "--poll-interval", "0.01", "--json-out", str(tmp_path / "summary.json"),
               "--junit-out", str(tmp_path / "report.xml"), *args]  # fmt: skip
    base = {"PATH": "/usr/bin:/bin", "ARMATURE_TOKEN": TOKEN}
    return subprocess.run(
        command, cwd=settings.BASE_DIR, env={**base, **(env or {})},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip


def progress(step: int, state: str = "running", **extra: object) -> dict:
    return {"state": state, "progress_step": step, "progress_total": 3, **extra}


FINISHED = progress(3, "succeeded", summary={"rollout/success_rate": 0.9, "charts/SPS": 100.0})

GITHUB = {"GITHUB_REPOSITORY": "o/r", "GITHUB_RUN_ID": "11", "GITHUB_RUN_ATTEMPT": "1",
          "GITHUB_JOB": "train"}  # fmt: skip


def test_it_creates_the_experiment_launches_follows_and_passes(plane_factory, tmp_path):
    plane = plane_factory([progress(0, "submitting"), progress(1), progress(2), FINISHED])
    done = run_client(plane, tmp_path, "--wait", "--set", "runner.seed=3", "--cluster", "lab",
                      "--timeout", "600", "--require", "success_rate>=0.8", env=GITHUB)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "experiment builtin-ppo: revision 1 (created)" in done.stdout
    assert f"run 7 queued: {plane.url}/runs/7/" in done.stdout
    for line in ("run 7 running  step 1/3 (33%)", "run 7 running  step 2/3 (66%)",
                 "run 7 succeeded  step 3/3 (100%)"):  # fmt: skip
        assert line in done.stdout
    assert "gate success_rate>=0.8: rollout/success_rate = 0.9 >= 0.8: passed" in done.stdout

    launch = next(r for r in plane.requests if r["path"] == "/api/v1/runs")
    assert launch["body"] == {"experiment": "builtin-ppo", "overrides": ["runner.seed=3"],
                              "revision": 1, "cluster": "lab", "timeout_s": 600}  # fmt: skip
    assert launch["headers"]["Idempotency-Key"].startswith("github-")
    created = next(r for r in plane.requests if r["path"] == "/api/v1/experiments")
    assert created["body"]["config_yaml"].startswith("name: builtin-ppo\n")

    summary = json.loads((tmp_path / "summary.json").read_text())
    assert (summary["status"], summary["exit_code"], summary["run_id"]) == ("succeeded", 0, 7)
    assert summary["metrics"]["rollout/success_rate"] == 0.9
    assert summary["gates"][0]["passed"] is True
    suite = ET.parse(tmp_path / "report.xml").getroot().find("testsuite")
    assert (suite.get("tests"), suite.get("failures")) == ("2", "0")


def test_the_same_ci_job_attempt_sends_the_same_key(plane_factory, tmp_path):
    plane = plane_factory([FINISHED])
    assert run_client(plane, tmp_path, env=GITHUB).returncode == 0
    assert run_client(plane, tmp_path, env=GITHUB).returncode == 0
    keys = [r["headers"]["Idempotency-Key"] for r in plane.requests if r["path"] == "/api/v1/runs"]
    assert len(keys) == 2 and keys[0] == keys[1]


def test_an_existing_experiment_gets_a_revision_and_a_failed_run_exits_1(plane_factory, tmp_path):
    plane = plane_factory([progress(1), progress(1, "failed", exit_reason="OOM")],
                          experiment_exists=True)  # fmt: skip
    done = run_client(plane, tmp_path, "--wait", "--require", "success_rate>=0.8")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "experiment builtin-ppo: revision 2 (new revision)" in done.stdout
    assert "run 7 failed: OOM" in done.stdout
    suite = ET.parse(tmp_path / "report.xml").getroot().find("testsuite")
    assert suite.find("testcase").find("failure").text == "OOM"


@pytest.mark.parametrize(
    ("final", "code", "status"),
    [
        (progress(3, "succeeded", summary={"rollout/success_rate": 0.5}), 3, "gate_failed"),
        (progress(2, "cancelled"), 4, "cancelled"),
        (progress(2, "timed_out"), 5, "timed_out"),
    ],
)
def test_each_ending_has_its_exit_code(plane_factory, tmp_path, final, code, status):
    plane = plane_factory([progress(1), final])
    done = run_client(plane, tmp_path, "--wait", "--require", "success_rate>=0.8")
    assert done.returncode == code, done.stdout + done.stderr
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == status


def test_without_wait_it_launches_and_exits_0(plane_factory, tmp_path):
    plane = plane_factory([progress(1)])
    done = run_client(plane, tmp_path)
    assert done.returncode == 0
    assert plane.polls == 0
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "launched"


def test_an_invalid_config_exits_6_naming_the_key_path(plane_factory, tmp_path):
    plane = plane_factory([FINISHED])
    plane.create_errors = {"errors": [{"path": "env.name", "message": "unknown env 'x'"}]}
    done = run_client(plane, tmp_path, "--wait")
    assert done.returncode == 6
    assert "POST experiments → 400: env.name: unknown env 'x'" in done.stdout
    suite = ET.parse(tmp_path / "report.xml").getroot().find("testsuite")
    assert suite.find("testcase").find("error") is not None


def test_a_bad_token_exits_6(plane_factory, tmp_path):
    plane = plane_factory([FINISHED])
    done = run_client(plane, tmp_path, env={"ARMATURE_TOKEN": "arm_wrong_x"})
    assert done.returncode == 6
    assert "→ 401: Unknown API token." in done.stdout


def test_an_unreachable_server_exits_6(tmp_path):
    config = tmp_path / "exp.yaml"
    config.write_text("name: x\n")
    done = subprocess.run(
        [sys.executable, "-c", NO_DJANGO, "submit", str(config), "--url", "http://127.0.0.1:9",
         "--token", TOKEN],
        cwd=settings.BASE_DIR, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 6
    assert "cannot reach http://127.0.0.1:9" in done.stdout


def test_it_gives_up_after_the_timeout_and_grace_and_cancels_the_run(plane_factory, tmp_path):
    plane = plane_factory([progress(1)])
    config = tmp_path / "exp.yaml"
    config.write_text("name: builtin-ppo\n")
    now = [0.0]

    def sleep(seconds: float) -> None:  # a fake clock: the test never waits for real
        now[0] += seconds

    options = SubmitOptions(config_path=config, url=plane.url, token=TOKEN, wait=True,
                            timeout_s=60, poll_interval_s=30.0,
                            gates=[parse_gate("success_rate>=0.8")])  # fmt: skip
    out = io.StringIO()
    outcome = submit(options, out=out, sleep=sleep, clock=lambda: now[0])
    assert (outcome.exit_code, outcome.status) == (5, "timed_out")
    assert plane.cancelled
    assert outcome.run["state"] == "cancelled"
    assert "still running after 60s (+120s grace): cancelled" in out.getvalue()
    assert not outcome.gates_evaluated


def test_the_subprocess_really_cannot_import_django():
    code = NO_DJANGO.split("sys.argv[0]")[0] + "import django\n"
    blocked = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert blocked.returncode == 1
    assert "django is blocked in this test" in blocked.stderr
