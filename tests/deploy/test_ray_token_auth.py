"""Ray 2.60's token authentication, on a real local head started as docker-compose.yml
starts its head (RAY_AUTH_MODE=token, RAY_AUTH_TOKEN): a request without the token is
refused, the control plane's Jobs client and health check send it and get through."""

import secrets
import urllib.error
import urllib.request

import pytest

from controlplane.core.health import _probe_ray
from controlplane.runs import ray_jobs
from tests.stack import RayHead

pytestmark = pytest.mark.timeout(240)

TOKEN = secrets.token_hex(32)


@pytest.fixture(scope="module")
def token_head(tmp_path_factory):
    head = RayHead(
        tmp_path_factory.mktemp("ray-token"),
        env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN},
        token=TOKEN,
    )
    yield head
    head.close()


@pytest.fixture
def ray_settings(settings, token_head):
    settings.RAY_ADDRESS = token_head.url
    settings.RAY_AUTH_TOKEN = TOKEN
    return settings


def status_of(url: str, headers: dict[str, str]) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=5):
            return 200
    except urllib.error.HTTPError as error:
        return error.code


def test_the_jobs_api_refuses_requests_without_the_token(token_head):
    jobs = f"{token_head.url}/api/jobs/"
    assert status_of(jobs, {}) == 401
    assert status_of(jobs, {"Authorization": "Bearer not-the-token"}) == 403
    assert status_of(jobs, {"Authorization": f"Bearer {TOKEN}"}) == 200
    # What compose's health check probes: public, so it needs no token.
    assert status_of(f"{token_head.url}/api/gcs_healthz", {}) == 200


def test_the_jobs_client_sends_the_token(ray_settings):
    assert ray_jobs.state("no-such-job") == ray_jobs.JobState(
        "MISSING", "Ray has no job no-such-job"
    )
    assert ray_jobs.client().list_jobs() == []


def test_the_health_check_sends_the_token(ray_settings):
    detail, info = _probe_ray()
    assert info["nodes"] == 1 and info["cpus"] == 2


@pytest.mark.parametrize("token", ["", "not-the-token"])
def test_without_the_right_token_both_say_so(ray_settings, token):
    ray_settings.RAY_AUTH_TOKEN = token
    with pytest.raises(ray_jobs.RayRefused, match="RAY_AUTH_TOKEN is missing or not this"):
        _probe_ray()
    with pytest.raises(ray_jobs.RayRefused, match="RAY_AUTH_TOKEN is missing or not this"):
        ray_jobs.state("no-such-job")
