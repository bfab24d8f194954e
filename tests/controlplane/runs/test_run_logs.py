"""A run's log, on a real Ray job whose log is large (about 55 MB): the run page's panel
shows its last lines at a cost bounded by what it shows, not by the log; polls within
the cache window read Ray once; each user's polls are limited; a download (the page's
and the API's) streams the whole log through Django's ASGI handler, as the web server
serves it, without holding it."""

import random
import sys
import tracemalloc
import uuid

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client
from ray.job_submission import JobStatus, JobSubmissionClient

from controlplane.api.tokens import create_token
from controlplane.experiments.services import create_experiment
from controlplane.runs import ray_jobs
from controlplane.runs.models import Run
from tests.asgi_fetch import HEAD_BYTES, Fetched, fetch_through_asgi
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(400)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
LOG_LINES = 500_000
LINE_TEXT = "x" * 99
LAST_LINE = "THE END"
JOB = (
    "import sys\n"
    f"for i in range({LOG_LINES}):\n"
    f"    sys.stdout.write(f'{{i:08d}} {LINE_TEXT}\\n')\n"
    f"print({LAST_LINE!r})\n"
)
# What the job prints; Ray's log has a few lines of its own before it.
LOG_BYTES = LOG_LINES * (9 + len(LINE_TEXT) + 1) + len(LAST_LINE) + 1
RAYS_OWN_BYTES = HEAD_BYTES
# What one request may cost the web process: a tenth of the log (it should be far less).
MEMORY_BOUND = LOG_BYTES // 10
# The job's run: a primary key no other test's run takes (each test stores it anew).
RUN_PK = random.randrange(10**8, 10**9)


@pytest.fixture(scope="module")
def big_log(ray_head, tmp_path_factory):
    """A finished Ray job of run RUN_PK that printed LOG_BYTES."""
    script = tmp_path_factory.mktemp("big-log") / "print_a_lot.py"
    script.write_text(JOB)
    jobs = JobSubmissionClient(ray_head.url, headers=ray_head.headers)
    submission_id = f"armature-run-{RUN_PK}"
    jobs.submit_job(entrypoint=f"{sys.executable} {script}", submission_id=submission_id)
    wait_until(lambda: jobs.get_job_status(submission_id).is_terminal(), 180, "the job to end", 1)
    assert jobs.get_job_status(submission_id) == JobStatus.SUCCEEDED
    return ray_head


@pytest.fixture
def run(big_log, settings) -> Run:
    settings.RAY_ADDRESS = big_log.url
    # A cache of this test's own: what another test kept of "run RUN_PK" is not seen.
    settings.CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.locmem.LocMemCache",
            "LOCATION": f"run-logs-{uuid.uuid4()}",
        }
    }
    experiment = create_experiment("big-log", CONFIG)
    return Run.objects.create(
        pk=RUN_PK, experiment=experiment, revision=experiment.latest_revision,
        config_yaml=CONFIG, ray_job_id=f"armature-run-{RUN_PK}",
    )  # fmt: skip


def viewer(name: str) -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_user(name))
    return client


def panel_url(run: Run) -> str:
    return f"/runs/{run.pk}/logs/"


def line(number: int) -> str:
    return f"{number:08d} {LINE_TEXT}"


def test_the_panel_shows_the_last_lines_at_a_cost_bounded_by_what_it_shows(run):
    client = viewer("vera")
    client.get(panel_url(run))  # what a first request costs once (imports, templates)
    cache.clear()  # the measured poll reads Ray again
    tracemalloc.start()
    try:
        response = client.get(panel_url(run))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    html = response.content.decode()
    # The last 200 lines: the 199 last numbered ones and the closing line.
    assert line(LOG_LINES - 199) in html and LAST_LINE in html
    assert line(LOG_LINES - 200) not in html
    assert peak < MEMORY_BOUND, f"one poll cost {peak / 2**20:.0f} MiB of a {LOG_BYTES} B log"


def test_polls_within_the_cache_window_read_ray_once(run, settings, monkeypatch):
    settings.ARMATURE_LOG_TAIL_CACHE_S = 600  # the window outlasts the test
    asked = []
    request = ray_jobs._request

    def counted(method: str, endpoint: str, *args, **kwargs):
        asked.append(endpoint)
        return request(method, endpoint, *args, **kwargs)

    monkeypatch.setattr(ray_jobs, "_request", counted)
    first = viewer("vera").get(panel_url(run))
    assert first.status_code == 200 and LAST_LINE in first.content.decode()
    read_once = list(asked)
    assert read_once  # the first poll asked Ray
    others = [viewer("otto"), viewer("olga")]  # more tabs, more users: the same run
    for client in [*others, *others]:
        again = client.get(panel_url(run))
        assert again.status_code == 200 and again.content == first.content
    assert asked == read_once


def test_each_users_polls_are_limited(run, settings):
    settings.ARMATURE_LOG_POLLS_PER_MINUTE = 3
    vera, otto = viewer("vera"), viewer("otto")
    answers = [vera.get(panel_url(run)).status_code for _ in range(4)]
    assert answers == [200, 200, 200, 429]
    assert otto.get(panel_url(run)).status_code == 200  # the limit is per user


def assert_whole_log_streamed(fetched: Fetched) -> None:
    assert fetched.status == 200, fetched.head
    assert f"\n{line(0)}\n{line(1)}\n" in fetched.head.decode()
    assert fetched.tail.decode().endswith(f"{line(LOG_LINES - 1)}\n{LAST_LINE}\n")
    assert LOG_BYTES < fetched.size < LOG_BYTES + RAYS_OWN_BYTES
    assert fetched.peak < MEMORY_BOUND, f"the download held {fetched.peak / 2**20:.0f} MiB"


def test_the_pages_download_streams_the_whole_log(run):
    client = viewer("vera")
    cookie = f"sessionid={client.cookies['sessionid'].value}"
    fetched = fetch_through_asgi(panel_url(run), "download=1", {"Cookie": cookie})
    assert_whole_log_streamed(fetched)
    assert fetched.headers["content-disposition"] == f'attachment; filename="run-{run.pk}.log"'


def test_the_apis_download_streams_the_whole_log(run):
    _, token = create_token(get_user_model().objects.create_user("vera"), "t")
    fetched = fetch_through_asgi(
        f"/api/v1/runs/{run.pk}/logs", "", {"Authorization": f"Bearer {token}"}
    )
    assert_whole_log_streamed(fetched)
    assert fetched.headers["content-type"].startswith("text/plain")
