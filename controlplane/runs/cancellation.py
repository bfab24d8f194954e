"""Cancelling a run: the user's intent is stored first, under the row lock, then the
job is stopped, by a task retried while Ray is unreachable and by every
reconciliation after it, so a cancel is never lost and never leaves a job running."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.runs import dispatch, ray_jobs
from controlplane.runs.models import Run, RunEvent, RunState
from controlplane.runs.state import transition, try_transition


def request_cancel(run_id: int, reason: str = "cancelled") -> Run:
    """Record the cancel. A run without a job (queued, interrupted) is cancelled at once:
    a submission in flight re-reads the row under the same lock and gives up."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.is_final:
            return run
        if run.cancel_requested_at is None:
            run.cancel_requested_at = timezone.now()
            run.save(update_fields=["cancel_requested_at"])
            RunEvent.objects.create(run=run, kind="cancel_requested", message=reason)
        if run.state in (RunState.QUEUED, RunState.INTERRUPTED):
            return transition(run.pk, RunState.CANCELLED, reason)
        dispatch.enforce_cancel_later(run.pk)
    return run


def enforce_cancel(run_id: int) -> Run:
    """Stop the job of a run whose cancel was requested; the run is cancelled once Ray
    has taken the stop (or has no job: a submission in flight stops the job it creates).

    Raises ray_jobs.RayUnavailable while Ray cannot be reached, so the task retries;
    after ARMATURE_CANCEL_CONFIRM_S of that the run is cancelled with the reason, and
    reconciliation stops its job as soon as Ray answers."""
    run = Run.objects.get(pk=run_id)
    if run.cancel_requested_at is None or run.is_final:
        return run
    reason = _requested_reason(run)
    try:
        ray_jobs.stop(run.submission_id)
    except ray_jobs.RayUnavailable as error:
        waited = timezone.now() - run.cancel_requested_at
        if waited < timedelta(seconds=settings.ARMATURE_CANCEL_CONFIRM_S):
            raise
        return try_transition(
            run.pk, RunState.CANCELLED,
            f"{reason}; Ray has not answered for {waited.total_seconds():.0f} s ({error}): "
            "its job will be stopped as soon as Ray answers",
        )  # fmt: skip
    return try_transition(run.pk, RunState.CANCELLED, reason)


def _requested_reason(run: Run) -> str:
    event = run.events.filter(kind="cancel_requested").order_by("-pk").first()
    return event.message if event and event.message else "cancelled"
