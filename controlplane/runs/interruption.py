"""Runs cut short by the control plane itself, and resuming them.

When `./armature up` stops (Ctrl-C) it owns the local Ray head, and every job on it is
about to die: it stops them cleanly first (the trainer saves a checkpoint on SIGTERM),
waits for Ray to confirm, and marks those runs interrupted. An interrupted run resumes
as a new attempt of the same run, in the same artifact folder, from its last
checkpoint. (With RAY_ADDRESS pointing at a cluster, stopping the control plane leaves
runs alone: they keep running and reconciliation picks them up at the next start.)
"""

import logging
import time

from django.db import transaction

from controlplane.runs import artifacts, dispatch, ray_jobs
from controlplane.runs.models import Run, RunEvent, RunState
from controlplane.runs.state import transition, try_transition

log = logging.getLogger(__name__)

POLL_S = 0.5


class CannotResume(Exception):
    pass


INTERRUPT_REQUESTED = "interrupt_requested"


def interrupt_active_runs(reason: str, wait_s: float = 30.0) -> list[int]:
    """Stop the jobs of submitted and running runs, wait up to `wait_s` for Ray to
    confirm, and mark those runs interrupted. Returns their ids.

    Each run's intent is stored before its job is stopped: reconciliation, still running
    meanwhile, then takes a stopped job of these runs for an interruption, not a cancel.
    The runs stay running until their jobs end, so the trainers' last reports (the
    checkpoint they save on SIGTERM) are still accepted."""
    runs = list(Run.objects.filter(state__in=[RunState.SUBMITTING, RunState.RUNNING]))
    for run in runs:
        RunEvent.objects.create(
            run=run, kind=INTERRUPT_REQUESTED, message=reason, data={"attempt": run.attempt}
        )
        try:
            ray_jobs.stop(run.submission_id)
        except ray_jobs.RayJobsError as error:
            log.warning("run %s: could not stop job %s: %s", run.pk, run.submission_id, error)
    ended = _wait_for_jobs_to_end(runs, wait_s)
    for run in runs:
        try_transition(run.pk, RunState.INTERRUPTED, reason, job_ended=run.pk in ended)
    return [run.pk for run in runs]


def interrupt_reason(run: Run) -> str | None:
    """Why the run's current attempt is being interrupted, if it is."""
    event = (
        run.events.filter(kind=INTERRUPT_REQUESTED, data__attempt=run.attempt)
        .order_by("-pk")
        .first()
    )
    return event.message if event is not None else None


def _wait_for_jobs_to_end(runs: list[Run], wait_s: float) -> set[int]:
    deadline = time.monotonic() + wait_s
    ended: set[int] = set()
    while True:
        for run in runs:
            if run.pk in ended:
                continue
            try:
                if ray_jobs.state(run.submission_id).ended:
                    ended.add(run.pk)
            except ray_jobs.RayUnavailable:
                ended.add(run.pk)  # the head is gone: so are its jobs
        if len(ended) == len(runs) or time.monotonic() > deadline:
            return ended
        time.sleep(POLL_S)


def resume(run_id: int, by: object = None) -> Run:
    """Queue an interrupted run, or a cancelled one with a checkpoint, again as its next
    attempt. Raises CannotResume."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        refusal = resume_refusal(run)
        if refusal:
            raise CannotResume(refusal)
        if not run.job_ended:
            raise CannotResume(
                f"the job of run {run.pk}'s attempt {run.attempt} has not ended yet; "
                "try again in a few seconds"
            )
        run = transition(
            run.pk, RunState.QUEUED, f"resumed by {by}" if by else "resumed",
            attempt=run.attempt + 1, cancel_requested_at=None,
        )  # fmt: skip
        RunEvent.objects.create(run=run, kind="resumed", data={"attempt": run.attempt})
        dispatch.submit_later(run.pk)
    return run


def resume_refusal(run: Run) -> str:
    """Why `run` cannot be resumed ("" when it can, or will once its job has ended)."""
    if run.state == RunState.INTERRUPTED:
        return ""
    if run.state != RunState.CANCELLED:
        return f"run {run.pk} is {run.state}: only interrupted or cancelled runs resume"
    if run.is_eval:
        return f"run {run.pk} is a cancelled evaluation: evaluate the checkpoint again instead"
    if not artifacts.checkpoints(run.pk):
        return f"run {run.pk} was cancelled before its first checkpoint: launch it again instead"
    return ""
