from django.contrib import admin
from django.db.models import QuerySet
from django.http import HttpRequest

from controlplane.api import tokens
from controlplane.api.models import ApiToken


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    """Admins see everyone's tokens and revoke them; tokens are created on the Settings
    page only, where their owner sees the plain token once."""

    list_display = [
        "name", "user", "prefix", "created_at", "last_used_at", "expires_at", "revoked_at",
    ]  # fmt: skip
    list_filter = ["revoked_at", "expires_at"]
    search_fields = ["name", "prefix", "user__username"]
    readonly_fields = [
        "user", "prefix", "secret_hash", "created_at", "last_used_at", "expires_at", "revoked_at",
    ]  # fmt: skip
    actions = ["revoke"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset:
            tokens.revoke_token(token)
        self.message_user(request, f"Revoked {queryset.count()} token(s).")
