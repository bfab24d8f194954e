"""The one place that changes a run's state."""

import logging

from django.db import transaction
from django.utils import timezone

from controlplane.realtime.groups import RUNS_LIST, run_group, trainer_group
from controlplane.realtime.publish import publish
from controlplane.runs.models import FINAL_STATES, Run, RunEvent, RunState

log = logging.getLogger(__name__)

ALLOWED = {
    RunState.QUEUED: {RunState.SUBMITTING, RunState.CANCELLED, RunState.FAILED},
    RunState.SUBMITTING: {
        RunState.RUNNING, RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED,
        RunState.TIMED_OUT, RunState.INTERRUPTED,
    },
    RunState.RUNNING: {
        RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED, RunState.TIMED_OUT,
        RunState.INTERRUPTED,
    },
    # Resumed (queued again as a new attempt), or closed for good.
    RunState.INTERRUPTED: {RunState.QUEUED, RunState.CANCELLED},
    # Stopped by its user: resumed from its last checkpoint (interruption.resume says when).
    RunState.CANCELLED: {RunState.QUEUED},
}  # fmt: skip


class IllegalTransition(Exception):
    def __init__(self, run: Run, to: str):
        super().__init__(f"run {run.pk} cannot go from {run.state} to {to}")
        self.run, self.to = run, to


def transition(run_id: int, to: RunState, reason: str = "", **fields) -> Run:
    """Move run `run_id` to state `to`, recording an event and telling browsers.

    Raises IllegalTransition for a move the state machine does not allow (any move out
    of a final state but a cancelled run's resume); moving to the current state is a
    no-op."""
    with transaction.atomic():
        run = Run.objects.select_for_update().get(pk=run_id)
        if run.state == to:
            return run
        if to not in ALLOWED.get(run.state, set()):
            raise IllegalTransition(run, to)
        now = timezone.now()
        previous, run.state = run.state, to
        if to == RunState.QUEUED:  # resumed
            run.finished_at, run.exit_reason = None, ""
        elif to == RunState.SUBMITTING:
            run.submitted_at = now
        elif to == RunState.RUNNING:
            run.started_at = now
        elif to in FINAL_STATES or to == RunState.INTERRUPTED:
            run.finished_at = now
            run.exit_reason = reason or run.exit_reason
        for name, value in fields.items():
            setattr(run, name, value)
        run.save()
        RunEvent.objects.create(
            run=run, kind="state", message=reason, data={"from": previous, "to": to}
        )
        message = {"type": "run.state", "run": run.pk, "state": to, "reason": reason}
        transaction.on_commit(lambda: _announce(run.pk, message, run.source_run_id))
        if not run.takes_reports:  # its token is spent
            transaction.on_commit(lambda: _close_trainer_links(run.pk, to))
    return run


def _announce(run_id: int, message: dict, source_run_id: int | None = None) -> None:
    """To the run's page and the runs list; an eval run's also to the page of the run it
    evaluates (its evaluations card)."""
    sent = [(run_group(run_id), message), (RUNS_LIST, message)]
    if source_run_id is not None:
        about = {"type": "run.evaluation", "run": source_run_id, "evaluation": run_id}
        sent.append((run_group(source_run_id), {**about, "state": message["state"]}))
    for group, event in sent:
        try:
            publish(group, event)
        except Exception as error:  # the state is stored; browsers catch up on next load
            log.warning("run %s: could not tell %s it is %s: %r",
                        run_id, group, message["state"], error)  # fmt: skip


def try_transition(run_id: int, to: RunState, reason: str = "", **fields) -> Run:
    """`transition`, unless another path moved the run first (e.g. a cancel raced a
    finish): then the run as it is."""
    try:
        return transition(run_id, to, reason, **fields)
    except IllegalTransition:
        return Run.objects.get(pk=run_id)


def _close_trainer_links(run_id: int, state: str) -> None:
    """A final run's token is spent: close the links still open with it. Best effort:
    a link that misses this is refused at its next connect anyway."""
    try:
        publish(trainer_group(run_id), {"type": "link.close", "run": run_id, "state": state})
    except Exception:  # the state is stored; nothing here may undo or hide that
        log.warning("run %s: could not close its trainer links", run_id, exc_info=True)
