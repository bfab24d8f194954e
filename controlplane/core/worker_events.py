"""Tell browsers at once when a Celery worker comes up or goes down.

The status panel polls, but a refresh pushed from the worker itself makes a
restart visible immediately (and exercises the cross-process path).
"""

import logging

from celery.signals import worker_ready, worker_shutdown

from controlplane.realtime.groups import SYSTEM_STATUS
from controlplane.realtime.publish import publish

log = logging.getLogger(__name__)


def _announce(**_kwargs) -> None:
    try:
        publish(SYSTEM_STATUS, {"type": "status.refresh"})
    except OSError as exc:  # the web server may not be up yet; the next poll catches up
        log.info("status refresh not delivered: %s", exc)


worker_ready.connect(_announce, weak=False)
worker_shutdown.connect(_announce, weak=False)
