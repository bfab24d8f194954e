"""Choosing the link from the environment the control plane gives a Ray job.

With ARMATURE_URL, ARMATURE_RUN_ID and ARMATURE_RUN_TOKEN set the trainer reports to the
control plane; without them (the standalone CLI) it gets a link that does nothing.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from trainer.link.protocol import EventKind
from trainer.link.spool import SPOOL_FOLDER, Spool

log = logging.getLogger(__name__)

LINK_VARIABLES = ("ARMATURE_URL", "ARMATURE_RUN_ID", "ARMATURE_RUN_TOKEN")
FLUSH_TIMEOUT_VARIABLE = "ARMATURE_LINK_FLUSH_S"
ATTEMPT_VARIABLE = "ARMATURE_RUN_ATTEMPT"
SPOOL_LIMIT_VARIABLE = "ARMATURE_LINK_SPOOL_MB"
# The attempt's key for signing its spool lines (docs/link-protocol.md, "The spool").
SPOOL_KEY_VARIABLE = "ARMATURE_SPOOL_KEY"


class Link(Protocol):
    def event(self, kind: EventKind, data: dict[str, Any] | None = None) -> None: ...
    def metrics(self, step: int, values: dict[str, float], at: float | None = None) -> None: ...
    def progress(self, step: int, total: int) -> None: ...
    def live(self, payload: dict[str, Any]) -> None: ...
    def on_command(self, handler: Callable[[dict[str, Any]], None] | None) -> None: ...
    def close(self, timeout: float | None = None) -> bool: ...


class NullLink:
    """The link of a trainer that has no control plane: every call does nothing."""

    def event(self, kind: EventKind, data: dict[str, Any] | None = None) -> None:
        pass

    def metrics(self, step: int, values: dict[str, float], at: float | None = None) -> None:
        pass

    def progress(self, step: int, total: int) -> None:
        pass

    def live(self, payload: dict[str, Any]) -> None:
        pass

    def on_command(self, handler: Callable[[dict[str, Any]], None] | None) -> None:
        pass

    def close(self, timeout: float | None = None) -> bool:
        return True


def robot_link_from_env(source: str, environ: Mapping[str, str] | None = None) -> Link:
    """The link of a placed process that steps robots (`source`: `env-<rank>`), for the
    console only: its robots' live state out, operators' commands in, straight between
    this process and the control plane, so the safety rules run here on this process's
    clock whatever the learner does. It authenticates with the attempt's run token, like
    the run's own link, and stores nothing (takeover audits travel to the driver, whose
    link keeps the run's one numbered sequence). A NullLink without a control plane."""
    from trainer.link.client import TrainerLink

    environ = os.environ if environ is None else environ
    values = {name: environ.get(name, "").strip() for name in LINK_VARIABLES}
    if not all(values.values()):
        return NullLink()
    try:
        run_id = int(values["ARMATURE_RUN_ID"])
    except ValueError as error:
        log.warning("robot link disabled: %s", error)
        return NullLink()
    return TrainerLink(values["ARMATURE_URL"], run_id, values["ARMATURE_RUN_TOKEN"],
                       source=source, flush_timeout_s=0)  # fmt: skip


def link_from_env(environ: Mapping[str, str] | None = None, run_folder: Path | None = None) -> Link:
    """A TrainerLink when all three variables are set, else a NullLink. A half or
    malformed setup is logged and treated as no control plane: training goes on.

    With `run_folder` (and the attempt's spool key), messages are spooled to its
    link-spool/ until acknowledged."""
    environ = os.environ if environ is None else environ
    values = {name: environ.get(name, "").strip() for name in LINK_VARIABLES}
    if not any(values.values()):
        return NullLink()
    # Here, not at the top: a trainer without a control plane (a bare GPU machine
    # running tests/gpu) needs no WebSocket client.
    from trainer.link.client import DEFAULT_FLUSH_TIMEOUT_S, TrainerLink

    missing = [name for name, value in values.items() if not value]
    if missing:
        log.warning("link disabled: %s not set", ", ".join(missing))
        return NullLink()
    try:
        run_id = int(values["ARMATURE_RUN_ID"])
        flush_timeout_s = float(environ.get(FLUSH_TIMEOUT_VARIABLE) or DEFAULT_FLUSH_TIMEOUT_S)
        attempt = int(environ.get(ATTEMPT_VARIABLE) or 1)
        spool_limit = int(float(environ.get(SPOOL_LIMIT_VARIABLE) or 512) * 2**20)
    except ValueError as error:
        log.warning("link disabled: %s", error)
        return NullLink()
    spool = None
    spool_key = environ.get(SPOOL_KEY_VARIABLE, "").strip()
    if run_folder is not None and not spool_key:
        log.warning("link: %s not set, so no spool (the control plane would refuse its "
                    "unsigned lines); unacknowledged messages stay in memory",
                    SPOOL_KEY_VARIABLE)  # fmt: skip
    elif run_folder is not None:
        try:
            spool = Spool(run_folder / SPOOL_FOLDER, attempt, spool_key, spool_limit)
        except OSError as error:
            log.warning("link: no spool in %s (%s); unacknowledged messages stay in memory",
                        run_folder, error)  # fmt: skip
    return TrainerLink(
        values["ARMATURE_URL"],
        run_id,
        values["ARMATURE_RUN_TOKEN"],
        flush_timeout_s=flush_timeout_s,
        spool=spool,
    )
