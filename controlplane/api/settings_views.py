"""The Settings page: the user's role and their API tokens (create — shown once, with an
expiry —, list with last use and expiry, revoke)."""

from datetime import datetime, timedelta

from django import forms
from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from controlplane.access.pages import guarded
from controlplane.access.roles import role_of
from controlplane.api import tokens
from controlplane.api.models import ApiToken

EXPIRY_CHOICES = [("7", "in 7 days"), ("30", "in 30 days"), ("90", "in 90 days"),
                  ("365", "in a year"), ("never", "never")]  # fmt: skip


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="What it is for, e.g. “GitHub CI”.",
        widget=forms.TextInput(attrs={"placeholder": "GitHub CI", "autocomplete": "off"}),
    )
    expires = forms.ChoiceField(label="Expires", choices=EXPIRY_CHOICES, initial="90")

    def expires_at(self) -> datetime | None:
        days = self.cleaned_data["expires"]
        return None if days == "never" else timezone.now() + timedelta(days=int(days))


def _page(
    request: HttpRequest, form: TokenForm, new_token: str | None = None, status: int = 200
) -> HttpResponse:
    context = {
        "role": role_of(request.user),
        "tokens": tokens.tokens_of(request.user),
        "form": form,
        "new_token": new_token,
    }
    return render(request, "settings/settings.html", context, status=status)


@never_cache
@guarded
def settings_page(request: HttpRequest) -> HttpResponse:
    return _page(request, TokenForm())


# never_cache: the response carries the plain token, which no cache may keep.
@never_cache
@guarded
def create_token(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST)
    if not form.is_valid():
        return _page(request, form, status=400)
    # Rendered straight away rather than redirected to: the plain token must not be
    # kept anywhere (session, URL) to survive a redirect.
    _, plain = tokens.create_token(
        request.user, form.cleaned_data["name"], expires_at=form.expires_at()
    )
    return _page(request, TokenForm(), new_token=plain)


@guarded
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    tokens.revoke_token(token)
    messages.success(request, f"Token “{token.name}” (arm_{token.prefix}) revoked.")
    return redirect("settings")
