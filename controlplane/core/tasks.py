"""Tasks of the core app: the round trip used by the health checks."""

import time

from celery import shared_task


@shared_task(name="core.ping", soft_time_limit=5, time_limit=10)
def ping(sent_at: float) -> dict:
    """Answer at once, so a caller can time broker → worker → result backend."""
    return {"sent_at": sent_at, "answered_at": time.time()}
