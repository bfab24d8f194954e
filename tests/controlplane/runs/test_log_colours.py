"""A job log's terminal colours, on a real Ray job that prints them as Ray's prefixes
do: the run page's panel renders them as classes (the text escaped, no escape byte
left), and a download is plain text unless asked for the escapes (`?ansi=1`)."""

import random
import sys

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.contrib.auth import get_user_model
from django.test import Client
from ray.job_submission import JobStatus, JobSubmissionClient

from controlplane.experiments.services import create_experiment
from controlplane.runs.log_text import as_html, without_escapes
from controlplane.runs.models import Run
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(300)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
PRINTED = [
    "\x1b[36m(ActorRank pid=4242)\x1b[0m iteration 1 <script>alert(1)</script>",
    "\x1b[1;31mERROR\x1b[0m the env worker died\x1b[K",
    "plain line",
]
RUN_PK = random.randrange(10**8, 10**9)


@pytest.fixture(scope="module")
def coloured_job(ray_head, tmp_path_factory):
    script = tmp_path_factory.mktemp("colours") / "print_colours.py"
    script.write_text(f"for line in {PRINTED!r}:\n    print(line)\n")
    jobs = JobSubmissionClient(ray_head.url, headers=ray_head.headers)
    jobs.submit_job(entrypoint=f"{sys.executable} {script}", submission_id=f"armature-run-{RUN_PK}")
    wait_until(lambda: jobs.get_job_status(f"armature-run-{RUN_PK}").is_terminal(), 180, "job")
    assert jobs.get_job_status(f"armature-run-{RUN_PK}") == JobStatus.SUCCEEDED
    return ray_head


@pytest.fixture
def client(coloured_job, settings) -> Client:
    settings.RAY_ADDRESS = coloured_job.url
    experiment = create_experiment("colours", CONFIG)
    Run.objects.create(
        pk=RUN_PK, experiment=experiment, revision=experiment.latest_revision,
        config_yaml=CONFIG, ray_job_id=f"armature-run-{RUN_PK}",
    )  # fmt: skip
    client = Client()
    client.force_login(get_user_model().objects.create_user("vera"))
    return client


def test_the_panel_shows_the_colours_as_classes_and_the_text_escaped(client):
    html = client.get(f"/runs/{RUN_PK}/logs/").content.decode()
    assert '<span class="ansi36">(ActorRank pid=4242)</span> iteration 1' in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script>" not in html
    assert '<span class="ansi1 ansi31">ERROR</span> the env worker died' in html
    assert "\x1b" not in html and "[0m" not in html
    assert 'data-lines="' in html


def body(response) -> bytes:
    """A streamed download's bytes (its chunks come from an async iterator, as daphne
    reads them)."""

    async def read() -> bytes:
        return b"".join([chunk async for chunk in response.streaming_content])

    return async_to_sync(read)()


def test_a_download_is_plain_text_unless_the_escapes_are_asked_for(client):
    plain = body(client.get(f"/runs/{RUN_PK}/logs/?download=1"))
    for line in ("(ActorRank pid=4242) iteration 1 <script>alert(1)</script>",
                 "ERROR the env worker died", "plain line"):  # fmt: skip
        assert line.encode() in plain
    assert b"\x1b" not in plain
    raw = body(client.get(f"/runs/{RUN_PK}/logs/?download=1&ansi=1"))
    assert PRINTED[0].encode() in raw


def test_an_escape_split_between_two_chunks_is_removed_whole():
    data = b"\x1b[36m(pid=1)\x1b[0m ok \x1b[1;31mERR\x1b[0m\x1b[2K\n"
    for cut in range(1, len(data)):
        assert b"".join(without_escapes(iter([data[:cut], data[cut:]]))) == b"(pid=1) ok ERR\n"


def test_text_with_no_escape_is_only_escaped():
    assert as_html("a < b & c") == "a &lt; b &amp; c"
