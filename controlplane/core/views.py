from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.cache import never_cache

from controlplane.access.doors import SEE, may
from controlplane.access.pages import guarded
from controlplane.core.health import collect_status, status_as_json
from controlplane.experiments.forms import LaunchForm
from controlplane.experiments.models import Experiment
from controlplane.runs.models import ACTIVE_STATES
from controlplane.runs.selectors import listed_runs


@guarded
def home(request: HttpRequest) -> HttpResponse:
    runs = listed_runs()  # with the figures the runs list shows (success, duration)
    return render(
        request,
        "core/home.html",
        {
            "active_runs": runs.filter(state__in=ACTIVE_STATES)[:10],
            "recent_runs": runs.exclude(state__in=ACTIVE_STATES)[:10],
            "can_launch": may(request.user, "run-launch", "POST"),
            "experiments": Experiment.objects.only("name"),
            "launch_form": LaunchForm(),
        },
    )


@never_cache
@guarded
async def healthz(request: HttpRequest) -> JsonResponse:
    detailed = await sync_to_async(may)(await request.auser(), "healthz-detail", SEE)
    report = status_as_json(await collect_status(), detailed=detailed)
    return JsonResponse(report, status=200 if report["status"] == "up" else 503)
