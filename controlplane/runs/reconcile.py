"""Keeping each run's state true to its Ray job's, and timing out runs that wait.

Celery beat calls `reconcile` for every run in `runs_to_reconcile()` every few seconds:
active runs, and finished runs whose job Ray has not yet reported ended (a cancelled
run's job is stopped here until Ray confirms). The trainer's own reports move a run at
once (runs.telemetry); this is the safety net for a trainer that dies silently.
"""

from datetime import timedelta

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from controlplane.runs import ray_jobs
from controlplane.runs.cancellation import enforce_cancel
from controlplane.runs.interruption import interrupt_reason
from controlplane.runs.models import ACTIVE_STATES, Run, RunState
from controlplane.runs.spool_ingest import has_spool, ingest_spools
from controlplane.runs.state import try_transition
from controlplane.runs.submission import submit, submit_again

# A run still queued, or "submitting" without a Ray job, this long after it was
# created or submitted is submitted again (the first attempt was lost, e.g. the
# worker died or the broker was down).
RESUBMIT_AFTER = timedelta(seconds=30)
# A failed run's exit reason ends with its log's last lines (and no more than this of
# them: one endless line is not taken whole).
LOG_TAIL_LINES = 20
LOG_TAIL_MAX_BYTES = 16 * 1024

STATE_OF_ENDED_JOB = {
    "SUCCEEDED": RunState.SUCCEEDED,
    "FAILED": RunState.FAILED,
    "STOPPED": RunState.CANCELLED,
}


def runs_to_reconcile() -> list[int]:
    return list(
        Run.objects.filter(Q(state__in=ACTIVE_STATES) | Q(job_ended=False)).values_list(
            "pk", flat=True
        )
    )


def reconcile(run_id: int) -> Run:
    """Bring the run's state in line with its Ray job's."""
    run = Run.objects.get(pk=run_id)
    now = timezone.now()
    if run.state == RunState.QUEUED:
        return submit(run.pk) if now - run.created_at > RESUBMIT_AFTER else run
    if run.is_active and run.cancel_requested_at is not None:
        return enforce_cancel(run.pk)
    if not run.is_active and run.job_ended:
        return run
    job = ray_jobs.state(run.submission_id)
    if job.ended and has_spool(run.pk):
        # The trainer's own last words first; a pass that could not finish (another
        # holds the run, or its time ran out) leaves the run to the next one.
        if not ingest_spools(run).done:
            return Run.objects.get(pk=run.pk)
        run = Run.objects.get(pk=run.pk)
    if not run.is_active:  # over, or interrupted: its job must end too
        if job.ended:
            Run.objects.filter(pk=run.pk).update(job_ended=True)
        else:
            ray_jobs.stop(run.submission_id)
        return Run.objects.get(pk=run.pk)
    if job.status == "RUNNING" and run.state == RunState.SUBMITTING:
        run = try_transition(run.pk, RunState.RUNNING, "Ray started the job",
                             ray_job_id=run.submission_id)  # fmt: skip
    if job.status in STATE_OF_ENDED_JOB:
        state = STATE_OF_ENDED_JOB[job.status]
        reason = _failure_reason(run, job.message) if state == RunState.FAILED else job.message
        interrupted = interrupt_reason(run) if job.status == "STOPPED" else None
        if interrupted is not None:  # stopped by `./armature up` going down
            state, reason = RunState.INTERRUPTED, interrupted
        return try_transition(run.pk, state, reason or job.status.lower(), job_ended=True)
    if run.state == RunState.SUBMITTING:
        return _waiting(run, job, now)
    if job.status == "MISSING":  # running, and Ray no longer knows its job
        return try_transition(
            run.pk, RunState.INTERRUPTED,
            f"Ray no longer knows job {run.submission_id} (was its head restarted?); "
            "resume the run to continue from its last checkpoint",
            job_ended=True,
        )  # fmt: skip
    if run.timeout_s and run.started_at:
        if now - run.started_at > timedelta(seconds=run.timeout_s):
            ray_jobs.stop(run.submission_id)
            return try_transition(run.pk, RunState.TIMED_OUT, f"no result after {run.timeout_s} s")
    return run


def _waiting(run: Run, job: ray_jobs.JobState, now) -> Run:
    """A submitted run whose job has not started: still pending, lost, or stuck."""
    waited = now - run.submitted_at
    limit = settings.ARMATURE_PENDING_TIMEOUT_S
    if waited > timedelta(seconds=limit):
        if job.status != "MISSING":
            ray_jobs.stop(run.submission_id)
        where = "Ray has no job for it" if job.status == "MISSING" else f"job {job.status}"
        detail = f": {job.message}" if job.message else ""
        return try_transition(
            run.pk, RunState.TIMED_OUT,
            f"not started {waited.total_seconds():.0f} s after its submission "
            f"(limit {limit:.0f} s, ARMATURE_PENDING_TIMEOUT_S); {where}{detail}",
        )  # fmt: skip
    if job.status == "MISSING" and waited > RESUBMIT_AFTER:
        return submit_again(run.pk)
    return run


def _failure_reason(run: Run, message: str) -> str:
    try:
        text = ray_jobs.log_tail(run.submission_id, LOG_TAIL_LINES, LOG_TAIL_MAX_BYTES)
        tail = text.strip().splitlines()[-LOG_TAIL_LINES:]
    except ray_jobs.RayJobsError:
        tail = []
    return "\n".join([message, *tail]).strip()
