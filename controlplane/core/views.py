from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from controlplane.core.health import collect_status, status_as_json


@login_required
def home(request: HttpRequest) -> HttpResponse:
    return render(request, "core/home.html")


@never_cache
async def healthz(request: HttpRequest) -> JsonResponse:
    report = status_as_json(await collect_status())
    return JsonResponse(report, status=200 if report["status"] == "up" else 503)
