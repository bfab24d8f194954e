"""The control plane's door to Ray: the dashboard's Jobs and state APIs at RAY_ADDRESS.
Nothing else in the control plane talks to Ray.

Every call has a deadline (`RAY_REQUEST_TIMEOUT_S`) and fails with one of two typed
errors: `RayUnavailable` (no answer, or a 5xx: try again later) or `RayRefused` (a 4xx:
trying again will not help). The Ray SDK raises `requests`' exceptions, which are not
the builtin `ConnectionError`; they are translated here, in one place.
"""

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import requests
from django.conf import settings
from ray.exceptions import AuthenticationError
from ray.job_submission import JobSubmissionClient

from controlplane.core.ray_auth import ray_auth_headers

TERMINAL_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})


class RayJobsError(Exception):
    def __init__(self, message: str, status_code: int | None = None):
        super().__init__(message)
        self.status_code = status_code


class RayUnavailable(RayJobsError):
    """Ray did not answer in time, refused the connection, or failed (5xx)."""


class RayRefused(RayJobsError):
    """Ray answered that the request is invalid (4xx)."""


@dataclass
class JobState:
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED | MISSING
    message: str = ""

    @property
    def ended(self) -> bool:
        return self.status in TERMINAL_STATUSES or self.status == "MISSING"


class _BoundedClient(JobSubmissionClient):
    """The SDK's client, kept for `submit` alone: it uploads the job's working_dir and
    py_modules as packages first, which the REST API leaves to the client. Its one
    change, a deadline and typed errors, sits on `_do_request`, the method every SDK
    call goes through (tests/controlplane/runs/test_ray_jobs_sdk.py pins that for the
    pinned Ray)."""

    def _do_request(self, method: str, endpoint: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", settings.RAY_REQUEST_TIMEOUT_S)
        response = super()._do_request(method, endpoint, **kwargs)
        if response.status_code >= 400 and response.status_code != 404:  # 404: no package yet
            raise _http_error(response)
        return response


def _http_error(response: requests.Response) -> RayJobsError:
    if response.status_code in (401, 403):
        return _refused_token(response.status_code)
    kind = RayUnavailable if response.status_code >= 500 else RayRefused
    return kind(f"Ray answered HTTP {response.status_code}: {response.text[:500]}",
                response.status_code)  # fmt: skip


def _refused_token(status_code: int) -> RayRefused:
    return RayRefused(
        f"Ray at {settings.RAY_ADDRESS} refused the request: RAY_AUTH_TOKEN is missing "
        "or not this cluster's token",
        status_code,
    )


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except RayJobsError:
        raise
    except AuthenticationError as error:  # the SDK's own error for an HTTP 401 or 403
        raise _refused_token(401) from error
    except (requests.RequestException, OSError) as error:  # OSError: the SDK's ConnectionError
        raise RayUnavailable(f"Ray at {settings.RAY_ADDRESS} is unreachable: {error}") from error
    except RuntimeError as error:  # the SDK's word for an answer it did not expect
        raise RayRefused(f"Ray at {settings.RAY_ADDRESS}: {error}") from error


def client() -> JobSubmissionClient:
    with _translated():
        return _BoundedClient(settings.RAY_ADDRESS, headers=ray_auth_headers())


def _request(method: str, endpoint: str, timeout_s: float | None = None) -> requests.Response:
    """One call of the dashboard's documented REST API, with the deadline; a 404 is
    returned (the callers say what it means), any other failure raised typed."""
    with _translated():
        response = requests.request(
            method,
            settings.RAY_ADDRESS.rstrip("/") + endpoint,
            headers=ray_auth_headers(),
            timeout=timeout_s or settings.RAY_REQUEST_TIMEOUT_S,
        )
    if response.status_code >= 400 and response.status_code != 404:
        raise _http_error(response)
    return response


def submit(submission_id: str, entrypoint: str, runtime_env: dict, metadata: dict) -> bool:
    """Submit once: True if this call started the job, False if a job with this
    submission id already existed (a retried task adopts it)."""
    try:
        with _translated():
            client().submit_job(
                entrypoint=entrypoint,
                submission_id=submission_id,
                runtime_env=runtime_env,
                metadata=metadata,
            )
    except RayJobsError:
        # Ray refuses a second job under an id (with a 500, wrapping its agent's error):
        # if the job exists now, this call came second and adopts it.
        if state(submission_id).status != "MISSING":
            return False
        raise
    return True


def state(submission_id: str) -> JobState:
    response = _request("GET", f"/api/jobs/{submission_id}")
    if response.status_code == 404:
        return JobState("MISSING", f"Ray has no job {submission_id}")
    info = response.json()
    return JobState(str(info.get("status", "")), info.get("message") or "")


def stop(submission_id: str) -> bool:
    """Ask Ray to stop the job; False when Ray has no such job."""
    response = _request("POST", f"/api/jobs/{submission_id}/stop")
    return response.status_code != 404


def logs(submission_id: str) -> str:
    response = _request("GET", f"/api/jobs/{submission_id}/logs")
    if response.status_code == 404:
        return ""
    return response.json().get("logs", "")


def live_nodes(timeout_s: float | None = None) -> list[dict]:
    """The cluster's live nodes as the dashboard's state API lists them (resources_total,
    labels, ...); a health check gives its own, shorter deadline."""
    response = _request("GET", "/api/v0/nodes?detail=1&limit=10000", timeout_s)
    if response.status_code == 404:
        raise RayRefused(f"Ray at {settings.RAY_ADDRESS} has no state API", 404)
    nodes = response.json()["data"]["result"]["result"]
    return [node for node in nodes if node.get("state") == "ALIVE"]
