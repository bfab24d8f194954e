from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, render

from controlplane.access.doors import may
from controlplane.access.pages import guarded
from controlplane.access.roles import has_role
from controlplane.console.consumers import CONTROL
from controlplane.console.selectors import estops, robots_online, takeovers
from controlplane.runs.frozen_config import ConfigError, frozen_section
from controlplane.runs.models import Run
from controlplane.runs.run_page import has_console


@guarded
def console_index(request: HttpRequest) -> HttpResponse:
    return render(request, "console/index.html", {"robots": robots_online()})


@guarded
def console_robots(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment"), pk=run_id)
    context = {
        "run": run,
        "has_console": has_console(run),
        "can_control": may(request.user, CONTROL, "SEE"),
        # An admin may clear another operator's e-stop: the page enables Clear stop.
        "is_admin": has_role(request.user, "admin"),
        "drawn_scene": env_name(run) == "builtin_reach",
    }
    return render(request, "console/robots.html", context)


def env_name(run: Run) -> str:
    try:
        return str(frozen_section(run, "env").get("name") or "")
    except ConfigError:
        return ""


@guarded
def console_audit(request: HttpRequest) -> HttpResponse:
    return render(request, "console/audit.html", {"takeovers": takeovers(), "estops": estops()})
