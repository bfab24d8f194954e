"""The control plane's door to Ray: the dashboard's Jobs and state APIs at RAY_ADDRESS.
Nothing else in the control plane talks to Ray.

Every call has a deadline (`RAY_REQUEST_TIMEOUT_S`) and fails with one of two typed
errors: `RayUnavailable` (no answer, or a 5xx: try again later) or `RayRefused` (a 4xx:
trying again will not help). The Ray SDK raises `requests`' exceptions, which are not
the builtin `ConnectionError`; they are translated here, in one place.
"""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from urllib.parse import urlencode

import requests
from django.conf import settings
from ray.exceptions import AuthenticationError
from ray.job_submission import JobSubmissionClient

from controlplane.core.ray_auth import ray_auth_headers

TERMINAL_STATUSES = frozenset({"STOPPED", "SUCCEEDED", "FAILED"})
# A job log is read in chunks of this size, never whole.
LOG_CHUNK_BYTES = 256 * 1024
# Ray's own deadline for sending a whole log (its default, 30 s, would cut a large one
# short); between two chunks the usual RAY_REQUEST_TIMEOUT_S applies.
LOG_STREAM_DEADLINE_S = 3600
# How Ray's state API says that the log file is not there (yet): its driver has just
# been placed, or never wrote.
NO_LOG_FILE = "Could not find a log file"


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


def _request(
    method: str, endpoint: str, timeout_s: float | None = None, stream: bool = False
) -> requests.Response:
    """One call of the dashboard's documented REST API, with the deadline; a 404 is
    returned (the callers say what it means), any other failure raised typed. With
    `stream`, the body is left to be read (and the response closed) by the caller."""
    with _translated():
        response = requests.request(
            method,
            settings.RAY_ADDRESS.rstrip("/") + endpoint,
            headers=ray_auth_headers(),
            timeout=timeout_s or settings.RAY_REQUEST_TIMEOUT_S,
            stream=stream,
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


def log_tail(submission_id: str, lines: int, max_bytes: int) -> str:
    """The last `lines` lines of the job's log, and of them at most the last `max_bytes`
    (a line cut there is left out): Ray reads them from the end of the file, so this
    costs what it returns whatever the log's size. "" while the job has no log."""
    response = _job_log(submission_id, lines, math.ceil(settings.RAY_REQUEST_TIMEOUT_S))
    if response is None:
        return ""
    kept, cut = bytearray(), False
    with response, _translated():
        for chunk in response.iter_content(LOG_CHUNK_BYTES):
            kept += chunk
            if len(kept) > max_bytes:
                del kept[:-max_bytes]
                cut = True
    if cut:
        del kept[: kept.find(b"\n") + 1]
    return kept.decode(errors="replace")


def log_stream(submission_id: str) -> Iterator[bytes]:
    """The job's whole log, chunk by chunk as Ray sends it (bytes as the job wrote
    them). Ray is asked here, so its refusal is raised here; failures while the chunks
    come are raised from the iteration."""
    response = _job_log(submission_id, -1, LOG_STREAM_DEADLINE_S)
    return _chunks(response)


def _chunks(response: requests.Response | None) -> Iterator[bytes]:
    if response is None:
        return
    with response, _translated():
        yield from response.iter_content(LOG_CHUNK_BYTES)


def _job_log(submission_id: str, lines: int, deadline_s: int) -> requests.Response | None:
    """Ray's state API sending the job's log (its last `lines` lines; -1: all of it)
    from the node that runs the job's driver, not yet read; None while there is no log
    (no such job, its driver not placed, its file not written)."""
    job = _request("GET", f"/api/jobs/{submission_id}")
    node_id = job.json().get("driver_node_id") if job.status_code != 404 else None
    if not node_id:
        return None
    query = {"node_id": node_id, "submission_id": submission_id, "lines": lines,
             "timeout": deadline_s}  # fmt: skip
    try:
        return _request("GET", f"/api/v0/logs/file?{urlencode(query)}", stream=True)
    except RayUnavailable as error:
        if NO_LOG_FILE in str(error):
            return None
        raise


def live_nodes(timeout_s: float | None = None) -> list[dict]:
    """The cluster's live nodes as the dashboard's state API lists them (resources_total,
    labels, ...); a health check gives its own, shorter deadline."""
    response = _request("GET", "/api/v0/nodes?detail=1&limit=10000", timeout_s)
    if response.status_code == 404:
        raise RayRefused(f"Ray at {settings.RAY_ADDRESS} has no state API", 404)
    nodes = response.json()["data"]["result"]["result"]
    return [node for node in nodes if node.get("state") == "ALIVE"]


def live_actors(timeout_s: float | None = None) -> list[dict]:
    """The cluster's live actors as the state API lists them (node_id, pid,
    required_resources, ...)."""
    response = _request("GET", "/api/v0/actors?detail=1&limit=10000", timeout_s)
    if response.status_code == 404:
        raise RayRefused(f"Ray at {settings.RAY_ADDRESS} has no state API", 404)
    actors = response.json()["data"]["result"]["result"]
    return [actor for actor in actors if actor.get("state") == "ALIVE"]
