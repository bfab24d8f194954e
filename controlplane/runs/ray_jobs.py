"""The control plane's door to the Ray Jobs API (the dashboard address in RAY_ADDRESS)."""

from dataclasses import dataclass

from django.conf import settings
from ray.job_submission import JobStatus, JobSubmissionClient


@dataclass
class JobState:
    status: str  # PENDING | RUNNING | STOPPED | SUCCEEDED | FAILED | MISSING
    message: str = ""


def client() -> JobSubmissionClient:
    return JobSubmissionClient(settings.RAY_ADDRESS)


def submit(submission_id: str, entrypoint: str, runtime_env: dict, metadata: dict) -> bool:
    """Submit once: True if this call started the job, False if a job with this
    submission id already existed (a retried task adopts it)."""
    try:
        client().submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env=runtime_env,
            metadata=metadata,
        )
    except RuntimeError as error:
        if "already exists" in str(error):
            return False
        raise
    return True


def state(submission_id: str) -> JobState:
    try:
        info = client().get_job_info(submission_id)
    except RuntimeError as error:
        if "does not exist" in str(error) or "404" in str(error):
            return JobState("MISSING", str(error))
        raise
    status = info.status.value if isinstance(info.status, JobStatus) else str(info.status)
    return JobState(status, info.message or "")


def stop(submission_id: str) -> None:
    try:
        client().stop_job(submission_id)
    except RuntimeError as error:
        if "does not exist" not in str(error):
            raise


def logs(submission_id: str) -> str:
    try:
        return client().get_job_logs(submission_id)
    except RuntimeError as error:
        if "does not exist" in str(error):
            return ""
        raise
