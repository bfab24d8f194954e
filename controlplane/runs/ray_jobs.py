"""The control plane's door to the Ray Jobs API (the dashboard address in RAY_ADDRESS).

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
    """The SDK's client with a deadline on every request and typed HTTP errors."""

    def _do_request(self, method: str, endpoint: str, **kwargs) -> requests.Response:
        kwargs.setdefault("timeout", settings.RAY_REQUEST_TIMEOUT_S)
        return super()._do_request(method, endpoint, **kwargs)

    def _raise_error(self, response: requests.Response) -> None:
        raise _http_error(response)


def _http_error(response: requests.Response) -> RayJobsError:
    kind = RayUnavailable if response.status_code >= 500 else RayRefused
    return kind(f"Ray answered HTTP {response.status_code}: {response.text[:500]}",
                response.status_code)  # fmt: skip


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except RayJobsError:
        raise
    except AuthenticationError as error:  # the SDK's own error for an HTTP 401 or 403
        raise RayRefused(
            f"Ray at {settings.RAY_ADDRESS} refused the request: RAY_AUTH_TOKEN is missing "
            "or not this cluster's token",
            401,
        ) from error
    except (requests.RequestException, OSError) as error:  # OSError: the SDK's ConnectionError
        raise RayUnavailable(f"Ray at {settings.RAY_ADDRESS} is unreachable: {error}") from error


def client() -> JobSubmissionClient:
    with _translated():
        return _BoundedClient(settings.RAY_ADDRESS, headers=ray_auth_headers())


def _request(method: str, endpoint: str) -> requests.Response:
    with _translated():
        response = client()._do_request(method, endpoint)
    if response.status_code >= 500:
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
    if response.status_code != 200:
        raise _http_error(response)
    info = response.json()
    return JobState(str(info.get("status", "")), info.get("message") or "")


def stop(submission_id: str) -> bool:
    """Ask Ray to stop the job; False when Ray has no such job."""
    response = _request("POST", f"/api/jobs/{submission_id}/stop")
    if response.status_code == 404:
        return False
    if response.status_code != 200:
        raise _http_error(response)
    return True


def logs(submission_id: str) -> str:
    response = _request("GET", f"/api/jobs/{submission_id}/logs")
    if response.status_code == 404:
        return ""
    if response.status_code != 200:
        raise _http_error(response)
    return response.json().get("logs", "")
