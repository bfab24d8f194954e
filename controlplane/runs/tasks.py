"""Celery tasks for runs: thin wrappers over the runs services, safe to retry.

Every task has soft and hard time limits (the worker's prefork pool enforces them), and
each remote call inside has its own deadline (RAY_REQUEST_TIMEOUT_S) well within them.
Retries fire on what really happens when Ray is away: ray_jobs.RayUnavailable
(connection refused, timeout, 5xx), not the builtin ConnectionError.
"""

from celery import shared_task

from controlplane.runs import cancellation, reconcile, submission, task_names
from controlplane.runs.ray_jobs import RayUnavailable

LIMITS = {"soft_time_limit": 120, "time_limit": 150}
RETRY_ON_RAY = {
    "autoretry_for": (RayUnavailable,),
    "retry_backoff": 2,
    "retry_backoff_max": 60,
    "retry_jitter": True,
}


@shared_task(name=task_names.SUBMIT, acks_late=True, max_retries=8, **LIMITS, **RETRY_ON_RAY)
def submit_run(run_id: int) -> str:
    submission.submit(run_id)
    return reconcile.reconcile(run_id).state


@shared_task(name=task_names.RECONCILE, acks_late=True, **LIMITS)
def reconcile_run(run_id: int) -> str:
    try:
        return reconcile.reconcile(run_id).state
    except RayUnavailable:  # the next periodic pass tries again
        return "ray unavailable"


@shared_task(name=task_names.RECONCILE_ACTIVE, soft_time_limit=30, time_limit=45)
def reconcile_active_runs() -> int:
    run_ids = reconcile.runs_to_reconcile()
    for run_id in run_ids:
        reconcile_run.delay(run_id)
    return len(run_ids)


# Until it lands: the periodic reconciliation also enforces pending cancels.
@shared_task(name=task_names.CANCEL, acks_late=True, max_retries=30, **LIMITS, **RETRY_ON_RAY)
def cancel_run(run_id: int) -> str:
    return cancellation.enforce_cancel(run_id).state
