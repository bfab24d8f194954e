"""The Settings page: the user's role and their API tokens (create — with the password
again, shown once, with an expiry no later than the longest lifetime —, list with last
use and expiry, revoke)."""

import secrets
from datetime import datetime, timedelta

from django import forms
from django.conf import settings
from django.contrib import messages
from django.contrib.auth import authenticate
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.cache import never_cache

from controlplane.access.pages import guarded
from controlplane.access.roles import role_of
from controlplane.api import tokens
from controlplane.api.models import ApiToken

EXPIRY_DAYS = {7: "in 7 days", 30: "in 30 days", 90: "in 90 days", 365: "in a year"}
ONCE_KEY = "armature.token-forms"
ONCE_KEPT = 5  # forms drawn and not yet sent, kept per session (several tabs)


def _issue_once(request: HttpRequest) -> str:
    once = secrets.token_urlsafe(16)
    request.session[ONCE_KEY] = [*request.session.get(ONCE_KEY, [])[-(ONCE_KEPT - 1) :], once]
    return once


def expiry_choices() -> list[tuple[str, str]]:
    """The expiries offered: those within the longest lifetime, and that one."""
    longest = settings.ARMATURE_TOKEN_MAX_DAYS
    days = {d: text for d, text in EXPIRY_DAYS.items() if d < longest}
    days[longest] = EXPIRY_DAYS.get(longest, f"in {longest} days")
    return [(str(d), text) for d, text in days.items()]


class TokenForm(forms.Form):
    name = forms.CharField(
        max_length=100,
        help_text="What it is for, e.g. “GitHub CI”.",
        widget=forms.TextInput(attrs={"placeholder": "GitHub CI", "autocomplete": "off"}),
    )
    expires = forms.ChoiceField(label="Expires", choices=expiry_choices)
    password = forms.CharField(
        label="Your password",
        strip=False,
        help_text="A token acts as you: say who you are again.",
        widget=forms.PasswordInput(attrs={"autocomplete": "current-password"}),
    )

    # One use per form drawn: a reload of the page that showed a new token sends the
    # same form again, which must not make a second token. The page is not redirected to
    # instead: the plain token would have to be kept (session, URL) to survive it.
    once = forms.CharField(widget=forms.HiddenInput, required=False)

    def __init__(self, *args, request: HttpRequest, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.request = request
        offered = [value for value, _ in expiry_choices()]
        self.fields["expires"].initial = "90" if "90" in offered else offered[-1]
        if not self.is_bound:
            self.fields["once"].initial = _issue_once(request)

    def clean_once(self) -> str:
        once = self.cleaned_data["once"]
        issued = self.request.session.get(ONCE_KEY, [])
        if once not in issued:
            raise forms.ValidationError(
                "This form was sent already (the page reloaded?): the token it made is "
                "listed above, its secret shown only that once. Fill the form in again "
                "for another token."
            )
        return once

    def use_once(self) -> None:
        """Spend the form's one use (once it made a token)."""
        issued = self.request.session.get(ONCE_KEY, [])
        self.request.session[ONCE_KEY] = [v for v in issued if v != self.cleaned_data["once"]]

    def clean_password(self) -> str:
        """The session's user's own password, checked as a login is (failures count
        towards the login lockout), so a hijacked session cannot mint a token."""
        user = self.request.user
        password = self.cleaned_data["password"]
        proved = authenticate(self.request, username=user.get_username(), password=password)
        if proved is None or proved.pk != user.pk:
            raise forms.ValidationError("That is not your password.")
        return password

    def expires_at(self) -> datetime:
        return timezone.now() + timedelta(days=int(self.cleaned_data["expires"]))


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
    return _page(request, TokenForm(request=request))


# never_cache: the response carries the plain token, which no cache may keep.
@never_cache
@guarded
def create_token(request: HttpRequest) -> HttpResponse:
    form = TokenForm(request.POST, request=request)
    if not form.is_valid():
        return _page(request, form, status=400)
    # Rendered straight away rather than redirected to: the plain token must not be
    # kept anywhere (session, URL) to survive a redirect.
    form.use_once()
    _, plain = tokens.create_token(
        request.user, form.cleaned_data["name"], expires_at=form.expires_at()
    )
    return _page(request, TokenForm(request=request), new_token=plain)


@guarded
def revoke_token(request: HttpRequest, token_id: int) -> HttpResponse:
    token = get_object_or_404(ApiToken, pk=token_id, user=request.user)
    tokens.revoke_token(token)
    messages.success(request, f"Token “{token.name}” (arm_{token.prefix}) revoked.")
    return redirect("settings")
