"""Per-user API tokens. Only a SHA-256 hash of each token's secret is stored: the plain
token is shown once, when it is created, and cannot be recovered afterwards."""

from datetime import datetime, timedelta

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'GitHub CI'.")
    # Public and unique: finds the row without scanning hashes, and lets people tell
    # their tokens apart (it is part of the token, so it is no secret).
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64, help_text="SHA-256 of the secret, hex.")
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(
        null=True,
        blank=True,
        help_text="After this the token stops working; empty: at the longest lifetime "
        "(ARMATURE_TOKEN_MAX_DAYS from its creation).",
    )
    # Which password the token was made under (api.tokens.password_stamp): a password
    # change, whoever makes it, ends every token made before it.
    password_stamp = models.CharField(max_length=64, default="", editable=False)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} (arm_{self.prefix}_…)"

    @property
    def is_revoked(self) -> bool:
        return self.revoked_at is not None

    @property
    def ends_at(self) -> datetime:
        """When it stops working: its expiry, or at the latest the longest lifetime."""
        longest = self.created_at + timedelta(days=settings.ARMATURE_TOKEN_MAX_DAYS)
        return min(self.expires_at, longest) if self.expires_at is not None else longest

    @property
    def is_expired(self) -> bool:
        return self.ends_at <= timezone.now()
