"""Reading what Ray holds about a run."""

from controlplane.runs import ray_jobs
from controlplane.runs.models import Run


def job_logs(run: Run) -> str:
    """The current attempt's job log ("" before it has a job). Raises RayJobsError."""
    return ray_jobs.logs(run.submission_id) if run.ray_job_id else ""
