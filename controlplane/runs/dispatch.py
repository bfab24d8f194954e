"""Handing work to Celery after a commit, without ever failing the commit's caller.

A broker that is down must not turn a stored change into an error: the periodic
reconciliation finds queued runs and pending cancels in the database and does the work
then. Tasks are sent by their registered names (`task_names`): the tasks import the
services that call this module.
"""

import logging
from functools import partial

from celery import current_app
from django.db import transaction

from controlplane.runs import task_names

log = logging.getLogger(__name__)


def submit_later(run_id: int) -> None:
    transaction.on_commit(partial(_send, task_names.SUBMIT, run_id), robust=True)


def enforce_cancel_later(run_id: int) -> None:
    transaction.on_commit(partial(_send, task_names.CANCEL, run_id), robust=True)


def reconcile_later(run_id: int) -> None:
    _send(task_names.RECONCILE, run_id)


def _send(task_name: str, run_id: int) -> None:
    try:
        current_app.send_task(task_name, args=[run_id])
    except Exception:
        log.warning("run %s: could not queue %s; the periodic reconciliation will do it",
                    run_id, task_name, exc_info=True)  # fmt: skip
