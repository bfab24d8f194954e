"""What `ray_jobs` relies on in Ray's job SDK, pinned: every SDK request goes through
`_do_request` (so the one override gives submit its deadline and typed errors), and the
REST calls of the dashboard answer as the module reads them. Against a stand-in
dashboard (a stdlib HTTP server) that answers as the pinned Ray does."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import ray

from controlplane.runs import ray_jobs

pytestmark = pytest.mark.embedded


class Dashboard(BaseHTTPRequestHandler):
    submit_status = 200
    seen: list[tuple[str, str]] = []

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, body: dict | None = None) -> None:
        data = json.dumps(body or {}).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _text(self, status: int, text: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.seen.append(("GET", self.path))
        if self.path == "/api/version":
            self._answer(200, {"version": "4", "ray_version": ray.__version__, "ray_commit": ""})
        elif self.path.startswith("/api/v0/nodes"):
            nodes = [{"state": "ALIVE", "resources_total": {"CPU": 4}}, {"state": "DEAD"}]
            self._answer(200, {"data": {"result": {"result": nodes}}})
        elif self.path in ("/api/jobs/job-2", "/api/jobs/job-3"):
            self._answer(200, {"status": "RUNNING", "driver_node_id": "n1"})
        elif self.path.startswith("/api/v0/logs/file?") and "submission_id=job-2" in self.path:
            # A driver placed, its log file not written yet: as the state API says it.
            self._text(500, "Could not find a log file. Please make sure the given option "
                            "exists in the cluster.")  # fmt: skip
        elif self.path.startswith("/api/v0/logs/file?") and "submission_id=job-3" in self.path:
            self._text(200, "one\ntwo\nthree\n")
        else:
            self._answer(404)

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.seen.append(("POST", self.path))
        if self.path == "/api/jobs/":
            self._answer(self.submit_status, {"submission_id": "job-1", "job_id": "job-1"})
        else:
            self._answer(404)


@pytest.fixture
def dashboard(settings):
    Dashboard.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Dashboard)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.RAY_ADDRESS = f"http://127.0.0.1:{server.server_address[1]}"
    settings.RAY_AUTH_TOKEN = ""
    yield Dashboard
    server.shutdown()
    server.server_close()


def test_submit_goes_through_do_request_and_its_typed_errors(dashboard):
    dashboard.submit_status = 200
    assert ray_jobs.submit("job-1", "true", {}, {}) is True
    assert ("POST", "/api/jobs/") in dashboard.seen
    dashboard.submit_status = 400
    with pytest.raises(ray_jobs.RayRefused) as refused:
        ray_jobs.submit("job-1", "true", {}, {})
    assert refused.value.status_code == 400


def test_the_rest_calls_read_the_dashboards_answers(dashboard):
    assert ray_jobs.state("job-9") == ray_jobs.JobState("MISSING", "Ray has no job job-9")
    assert ray_jobs.stop("job-9") is False
    assert ray_jobs.log_tail("job-9", 200, 4096) == ""
    assert list(ray_jobs.log_stream("job-9")) == []
    assert ray_jobs.live_nodes() == [{"state": "ALIVE", "resources_total": {"CPU": 4}}]


def test_a_log_is_read_from_the_drivers_node_and_bounded(dashboard):
    assert ray_jobs.log_tail("job-2", 200, 4096) == ""  # no file yet: nothing logged yet
    assert ray_jobs.log_tail("job-3", 2, 4096) == "one\ntwo\nthree\n"
    (asked,) = [path for _, path in dashboard.seen if "submission_id=job-3" in path]
    assert "node_id=n1" in asked and "lines=2" in asked
    assert ray_jobs.log_tail("job-3", 2, 8) == "three\n"  # the line cut at 8 bytes: left out
    assert b"".join(ray_jobs.log_stream("job-3")) == b"one\ntwo\nthree\n"
    asked = [path for _, path in dashboard.seen if "submission_id=job-3" in path]
    assert "lines=-1" in asked[-1]
