"""The access table at the doors of Django views (pages, htmx fragments, login)."""

import functools
from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import render

from controlplane.access.doors import Answer, Verdict, verdict


def door_of(request: HttpRequest) -> str:
    """The door is the URL's name; a request that no URL resolved has none (refused)."""
    match = request.resolver_match
    return match.view_name if match is not None and match.view_name else ""


def refusal(request: HttpRequest, decision: Verdict) -> HttpResponse | None:
    """The response that says no, or None to let the view answer."""
    if decision.answer is Answer.ALLOW:
        return None
    if decision.answer is Answer.NO_SUCH_METHOD:
        methods = list(decision.methods) + (["HEAD"] if "GET" in decision.methods else [])
        return HttpResponseNotAllowed(methods)
    if decision.answer is Answer.LOG_IN:
        return redirect_to_login(request.get_full_path())
    return render(request, "access/forbidden.html", {"reason": decision.reason}, status=403)


def guarded(view: Callable) -> Callable:
    """Let the request through only if the table's rule for its URL and method allows
    the user: otherwise 405 (a method the URL does not take), the login page (no user)
    or 403 (a role too low). Works on sync and async views alike."""
    if iscoroutinefunction(view):

        @functools.wraps(view)
        async def check_async(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            user = await request.auser()
            decision = await sync_to_async(verdict)(user, door_of(request), request.method)
            refused = refusal(request, decision)
            return refused if refused is not None else await view(request, *args, **kwargs)

        return markcoroutinefunction(check_async)

    @functools.wraps(view)
    def check(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        decision = verdict(request.user, door_of(request), request.method)
        refused = refusal(request, decision)
        return refused if refused is not None else view(request, *args, **kwargs)

    return check


def refused_status(request: HttpRequest, refused: object) -> int:
    """A form page answering with refused input (`refused` is truthy: the issues, the
    form's errors) answers 422, so scripts and tests see the refusal. An htmx fragment
    (validation as you type) answers 200 with the issues in it: the browser logs every
    4xx of a script's request as a console error, one per keystroke here."""
    if request.headers.get("HX-Request") == "true":
        return 200
    return 422 if request.method == "POST" and refused else 200
