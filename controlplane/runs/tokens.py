"""Run tokens: what a trainer presents on its link. A token is signed with the secret
key and names its run, so it is valid for that run only and needs no storage."""

from django.core import signing

SALT = "armature.run-token"


def make_run_token(run_id: int) -> str:
    return signing.dumps({"run": run_id}, salt=SALT)


def run_id_from_token(token: str) -> int | None:
    try:
        data = signing.loads(token, salt=SALT)
    except signing.BadSignature:
        return None
    run = data.get("run") if isinstance(data, dict) else None
    return run if isinstance(run, int) else None
