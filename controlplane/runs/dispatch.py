"""Handing work to Celery after a commit, without ever failing the commit's caller.

A broker that is down must not turn a stored change into an error: the periodic
reconciliation finds queued runs and pending cancels in the database and does the work
then. (Tasks are imported here, not at the top: they import the services that call
this module.)
"""

import logging
from functools import partial

from django.db import transaction

log = logging.getLogger(__name__)


def submit_later(run_id: int) -> None:
    transaction.on_commit(partial(_send, "submit_run", run_id), robust=True)


def enforce_cancel_later(run_id: int) -> None:
    transaction.on_commit(partial(_send, "cancel_run", run_id), robust=True)


def reconcile_later(run_id: int) -> None:
    _send("reconcile_run", run_id)


def _send(task_name: str, run_id: int) -> None:
    from controlplane.runs import tasks

    try:
        getattr(tasks, task_name).delay(run_id)
    except Exception:
        log.warning("run %s: could not queue %s; the periodic reconciliation will do it",
                    run_id, task_name, exc_info=True)  # fmt: skip
