"""Request bodies past `settings.MAX_REQUEST_BYTES` get 413 before any view reads them:
JSON for the API, a readable page (or htmx fragment) for people.

The declared `Content-Length` is checked up front. A body sent without one (chunked) is
caught when it is read, by Django's `DATA_UPLOAD_MAX_MEMORY_SIZE` (set to the same limit).
"""

from collections.abc import Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction, sync_to_async
from django.conf import settings
from django.core.exceptions import RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

API_PREFIX = "/api/"


def too_large_message(size: int | None, limit: int) -> str:
    what = f"The request body is {size} bytes" if size else "The request body is too large"
    return (
        f"{what}; the limit is {limit} bytes ({limit / 2**20:g} MiB, "
        "setting ARMATURE_MAX_REQUEST_BYTES)."
    )


def too_large(request: HttpRequest, size: int | None) -> HttpResponse:
    message = too_large_message(size, settings.MAX_REQUEST_BYTES)
    if request.path.startswith(API_PREFIX):
        return JsonResponse({"detail": message}, status=413)
    fragment = bool(request.headers.get("HX-Request"))
    template = "core/_too_large.html" if fragment else "core/too_large.html"
    return render(request, template, {"message": message}, status=413)


def declared_size(request: HttpRequest) -> int | None:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return None  # Django itself treats a malformed length as no body


class RequestBodyLimitMiddleware:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Callable) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        if iscoroutinefunction(self):
            return self._acall(request)
        size = declared_size(request)
        if size and size > settings.MAX_REQUEST_BYTES:
            return too_large(request, size)
        return self.get_response(request)

    async def _acall(self, request: HttpRequest) -> HttpResponse:
        size = declared_size(request)
        if size and size > settings.MAX_REQUEST_BYTES:
            return await sync_to_async(too_large)(request, size)  # the page reads the user
        return await self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, RequestDataTooBig):
            return too_large(request, None)
        return None
