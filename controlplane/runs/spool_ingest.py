"""Taking in what a trainer left in its link spool: the messages the control plane never
acknowledged (it was unreachable when the trainer exited, or the trainer died).

Reconciliation calls this once a run's job has ended, before it maps Ray's status onto
the run, so the trainer's own last words (`finished` with its summary, `failed` with its
error) decide the run's end even when they never made it over the link. Every message
goes through the same validation and idempotent storage as the live link.
"""

import logging
import re

from controlplane.runs import telemetry
from controlplane.runs.artifacts import run_artifact_dir
from controlplane.runs.models import Run
from trainer.link.protocol import InvalidMessage
from trainer.link.spool import SPOOL_FOLDER, Spool

log = logging.getLogger(__name__)

_SPOOL_FILE = re.compile(r"attempt-(\d+)\.jsonl$")


def has_spool(run_id: int) -> bool:
    return any((run_artifact_dir(run_id) / SPOOL_FOLDER).glob("attempt-*.jsonl"))


def ingest_spools(run: Run) -> int:
    """Store every unacknowledged message of every attempt's spool, then remove the
    spool. Returns how many messages were new."""
    stored = 0
    for path in sorted((run_artifact_dir(run.pk) / SPOOL_FOLDER).glob("attempt-*.jsonl")):
        attempt = int(_SPOOL_FILE.search(path.name).group(1))
        spool = Spool(path.parent, attempt)
        for _, payload in spool.messages(after=spool.acked_through()):
            try:
                message = telemetry.parse_message(payload)
            except InvalidMessage as invalid:
                log.warning("run %s: spooled message refused: %s", run.pk, invalid.error)
                telemetry.count_rejected(run.pk)
                continue
            # An earlier attempt's events are history: they do not move the run.
            if telemetry.record(run.pk, message, attempt, moves_state=attempt == run.attempt):
                stored += 1
        spool.remove()
    if stored:
        log.info("run %s: took in %d messages from its link spool", run.pk, stored)
    return stored
