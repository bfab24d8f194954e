"""Per-user API tokens: create (the plain token is returned once), revoke, authenticate.

A token reads `arm_<prefix>_<secret>`. The prefix finds the row; the secret is checked
against its stored SHA-256. A plain hash (no salt, no slow KDF) is enough because the
secret is 40 random characters (~238 bits), never a human-chosen password.

Revoking a login revokes its tokens: each token carries a stamp of the password it was
made under, so a password change (the user's, an admin's, `reset-admin-password`) ends
every token made before it, as it ends every session; a deactivated user's tokens are
refused; and no token outlives `ARMATURE_TOKEN_MAX_DAYS` from its creation.
"""

import hashlib
import hmac
import secrets
import string
from datetime import datetime, timedelta

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import QuerySet
from django.utils import timezone

from controlplane.api.models import ApiToken

TOKEN_PREFIX = "arm"
PREFIX_LENGTH = 8
SECRET_LENGTH = 40
# Alphanumerics only (no "_" in either part), so the token splits unambiguously and a
# double click selects all of it.
PREFIX_ALPHABET = string.ascii_lowercase + string.digits
SECRET_ALPHABET = string.ascii_letters + string.digits
# Writing last_used_at on every request would turn each API read into a DB write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


class InvalidToken(Exception):
    """The presented token is malformed, unknown, revoked, expired or its user is
    inactive."""


def _random(alphabet: str, length: int) -> str:
    return "".join(secrets.choice(alphabet) for _ in range(length))


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def password_stamp(user: AbstractBaseUser) -> str:
    """A stamp of the user's current password: its stored hash (salted, so a new
    password, even the same one set again, gives a new stamp), hashed once more."""
    return hashlib.sha256(f"api-token:{user.password}".encode()).hexdigest()


def create_token(
    user: AbstractBaseUser, name: str, expires_at: datetime | None = None
) -> tuple[ApiToken, str]:
    """A new token for `user`, working until `expires_at` (None, or later than the
    longest lifetime: until that), its user's password changes, or it is revoked;
    returns the row and the plain token, which is not stored."""
    prefix = _random(PREFIX_ALPHABET, PREFIX_LENGTH)
    while ApiToken.objects.filter(prefix=prefix).exists():  # 36^8 prefixes: a rare retry
        prefix = _random(PREFIX_ALPHABET, PREFIX_LENGTH)
    secret = _random(SECRET_ALPHABET, SECRET_LENGTH)
    token = ApiToken.objects.create(
        user=user,
        name=name.strip(),
        prefix=prefix,
        secret_hash=hash_secret(secret),
        expires_at=expires_at,
        password_stamp=password_stamp(user),
    )
    return token, f"{TOKEN_PREFIX}_{prefix}_{secret}"


def revoke_token(token: ApiToken) -> ApiToken:
    """Revoke for good; revoking twice keeps the first revocation time."""
    if token.revoked_at is None:
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    return token


def tokens_of(user: AbstractBaseUser) -> QuerySet[ApiToken]:
    return ApiToken.objects.filter(user=user).order_by("revoked_at", "-created_at")


def authenticate_token(raw: str) -> ApiToken:
    """The live token that `raw` is, with its user loaded; raises InvalidToken saying why."""
    parts = raw.strip().split("_", 2)
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2]:
        raise InvalidToken("Malformed API token: expected arm_<prefix>_<secret>.")
    _, prefix, secret = parts
    token = ApiToken.objects.select_related("user").filter(prefix=prefix).first()
    # compare_digest: the comparison time must not tell how much of a guess was right.
    if token is None or not hmac.compare_digest(token.secret_hash, hash_secret(secret)):
        raise InvalidToken("Unknown API token.")
    if token.revoked_at is not None:
        raise InvalidToken(f"API token '{token.name}' (arm_{prefix}) has been revoked.")
    now = timezone.now()
    if token.ends_at <= now:
        when = token.ends_at.strftime("%Y-%m-%d %H:%M UTC")
        raise InvalidToken(f"API token '{token.name}' (arm_{prefix}) expired on {when}.")
    if not token.user.is_active:
        raise InvalidToken("The user of this API token is inactive.")
    if not hmac.compare_digest(token.password_stamp, password_stamp(token.user)):
        raise InvalidToken(
            f"API token '{token.name}' (arm_{prefix}) was made before its user's password "
            "changed; create a new one."
        )
    if token.last_used_at is None or now - token.last_used_at >= LAST_USED_RESOLUTION:
        ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        token.last_used_at = now
    return token
