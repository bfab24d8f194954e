from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from controlplane.access.doors import may
from controlplane.access.pages import guarded
from controlplane.console.consumers import CONTROL
from controlplane.console.selectors import estops, robots_online, takeovers
from controlplane.runs.models import Run


@guarded
def console_index(request: HttpRequest) -> HttpResponse:
    return render(request, "console/index.html", {"robots": robots_online()})


@guarded
def console_robots(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=run_id)
    context = {"run": run, "can_control": may(request.user, CONTROL, "SEE")}
    return render(request, "console/robots.html", context)


@guarded
def console_audit(request: HttpRequest) -> HttpResponse:
    return render(request, "console/audit.html", {"takeovers": takeovers(), "estops": estops()})
