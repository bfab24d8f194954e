"""Waiting on Ray, in the run's words: one translation of Ray's errors for every
exchange between the processes of a run (actor ranks, env workers, rollout workers, the
RLPD learner and its acting workers).

Ray is imported on first use: `trainer run` without a placement never loads it.
"""

from __future__ import annotations

from typing import Any


def connect() -> None:
    """Join the Ray cluster (RAY_ADDRESS, set for a Ray job, says which) once. Joining
    replaces the process's SIGTERM handler with one that exits, so a run that stops
    cleanly on SIGTERM installs its own after this (trainer.commands.run)."""
    import ray

    if not ray.is_initialized():
        ray.init(log_to_driver=True)


def answer(
    refs: Any,
    *,
    who: str,
    doing: str,
    error: type[Exception],
    timeout_s: float | None = None,
    stalled: type[Exception] | None = None,
    passes: tuple[type[Exception], ...] = (),
) -> Any:
    """`ray.get(refs)` within `timeout_s`; what goes wrong is raised as `error` naming
    `who` failed, died or did not answer while `doing` (no answer: `stalled`, when
    given, instead of `error`). A failure of a type in `passes`
    keeps its type (a stall another process detected is still a stall). The remote
    traceback stays chained to the error (the run's `failed` event carries it)."""
    import ray

    try:
        return ray.get(refs, timeout=timeout_s)
    except ray.exceptions.GetTimeoutError:
        late = stalled or error
        raise late(f"{who} did not answer within {timeout_s:g} s while {doing}") from None
    except ray.exceptions.RayTaskError as failure:
        cause = getattr(failure, "cause", None) or failure
        if isinstance(cause, passes):
            raise type(cause)(str(cause)) from None
        raise error(f"{who} failed while {doing}: {cause}") from failure
    except ray.exceptions.RayActorError as failure:
        raise error(f"{who} died while {doing}: {failure}") from failure


def has_failed(ref: Any) -> bool:
    """Whether a finished call failed (its error is the caller's to report)."""
    import ray

    try:
        ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - which error is the caller's to report
        return True
    return False
