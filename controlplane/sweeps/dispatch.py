"""Queueing a sweep's next step after a commit, without ever failing the commit's
caller: the periodic step of every running sweep does it otherwise."""

import logging
from functools import partial

from celery import current_app
from django.db import transaction

from controlplane.sweeps import task_names

log = logging.getLogger(__name__)


def advance_later(sweep_id: int) -> None:
    transaction.on_commit(partial(_send, sweep_id), robust=True)


def _send(sweep_id: int) -> None:
    try:
        current_app.send_task(task_names.ADVANCE, args=[sweep_id])
    except Exception:
        log.warning("sweep %s: could not queue its step; the periodic one will do it",
                    sweep_id, exc_info=True)  # fmt: skip
