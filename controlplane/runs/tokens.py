"""Run tokens: what a trainer presents on its link. A token is signed with the secret
key and names its run and attempt, so it is valid for that attempt of that run only
(a resumed run's earlier job cannot report into it) and needs no storage."""

from dataclasses import dataclass

from django.core import signing
from django.utils.crypto import salted_hmac

SALT = "armature.run-token"
SPOOL_KEY_SALT = "armature.spool-key"


@dataclass(frozen=True)
class RunTokenClaims:
    run_id: int
    attempt: int


def make_run_token(run_id: int, attempt: int = 1) -> str:
    return signing.dumps({"run": run_id, "attempt": attempt}, salt=SALT)


def make_spool_key(run_id: int, attempt: int) -> str:
    """The key an attempt signs its link spool's lines with (docs/link-protocol.md). Derived
    from the secret key, so the control plane computes it again when it reads the spool
    (a run token is not reproducible: it carries the time it was signed); one per attempt
    of one run, so a job knows only its own and cannot write lines another run, or
    another attempt of its run, would take. Never written to disk."""
    return salted_hmac(SPOOL_KEY_SALT, f"{run_id}:{attempt}", algorithm="sha256").hexdigest()


def read_run_token(token: str) -> RunTokenClaims | None:
    try:
        data = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        return None
    if not isinstance(data, dict):
        return None
    run, attempt = data.get("run"), data.get("attempt", 1)
    if not (_is_int(run) and _is_int(attempt)):
        return None
    return RunTokenClaims(run, attempt)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
