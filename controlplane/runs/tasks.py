"""Celery tasks for runs: thin wrappers over runs.services, safe to retry."""

from celery import shared_task

from controlplane.runs import services


@shared_task(name="runs.submit", acks_late=True, autoretry_for=(ConnectionError,),
             retry_backoff=2, max_retries=5)  # fmt: skip
def submit_run(run_id: int) -> str:
    return services.submit(run_id).state


@shared_task(name="runs.reconcile", acks_late=True)
def reconcile_run(run_id: int) -> str:
    return services.reconcile(run_id).state


@shared_task(name="runs.reconcile_active")
def reconcile_active_runs() -> int:
    run_ids = services.active_run_ids()
    for run_id in run_ids:
        reconcile_run.delay(run_id)
    return len(run_ids)


@shared_task(name="runs.cancel", acks_late=True)
def cancel_run(run_id: int) -> str:
    return services.cancel(run_id).state
