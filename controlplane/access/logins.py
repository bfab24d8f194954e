"""What a locked-out login attempt sees (django-axes counts the failures; settings.py
says how many and for how long), and the address it counts them by."""

import math

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

TOO_MANY_REQUESTS = 429


def locked_out(
    request: HttpRequest,
    original_response: HttpResponse | None = None,
    credentials: dict | None = None,
) -> HttpResponse:
    """The login page again (the admin's login included), with status 429 and a message
    that says why and for how long."""
    username = (credentials or {}).get("username") or request.POST.get("username", "")
    minutes = math.ceil(settings.AXES_COOLOFF_TIME.total_seconds() / 60)
    message = (
        f"Too many failed attempts to log in as “{username}” from your address: "
        f"try again in {minutes} minute{'s' if minutes != 1 else ''}."
    )
    return render(
        request,
        "registration/login.html",
        {"locked_out": message, "next": request.POST.get("next", "")},
        status=TOO_MANY_REQUESTS,
    )


def client_address(request: HttpRequest) -> str | None:
    """The address a login comes from. Behind `ARMATURE_PROXY_COUNT` proxies, each of
    which appends the address it was reached from to X-Forwarded-For, the one the
    outermost proxy saw: else every client would share the proxy's address, and
    anyone could lock a user out for all of them by failing on purpose."""
    proxies = settings.ARMATURE_PROXY_COUNT
    forwarded = [part.strip() for part in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")]
    if proxies and len(forwarded) >= proxies and forwarded[-proxies]:
        return forwarded[-proxies]
    return request.META.get("REMOTE_ADDR")
