"""Celery tasks for sweeps: thin wrappers over `progress`, safe to run twice (a step
holds the sweep's lease; what it launches has an idempotency key)."""

from celery import shared_task

from controlplane.sweeps import progress, task_names

LIMITS = {"soft_time_limit": 120, "time_limit": 150}  # within progress.LEASE_S


@shared_task(name=task_names.ADVANCE, acks_late=True, **LIMITS)
def advance_sweep(sweep_id: int) -> str:
    return progress.advance(sweep_id).state


@shared_task(name=task_names.ADVANCE_ACTIVE, soft_time_limit=30, time_limit=45)
def advance_active_sweeps() -> int:
    sweep_ids = progress.active_sweep_ids()
    for sweep_id in sweep_ids:
        advance_sweep.delay(sweep_id)
    return len(sweep_ids)
