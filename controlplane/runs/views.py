from django.contrib import messages
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from controlplane.access.doors import may
from controlplane.access.pages import guarded
from controlplane.experiments.services import config_diff
from controlplane.runs import artifacts
from controlplane.runs.cancellation import request_cancel
from controlplane.runs.interruption import CannotResume, resume
from controlplane.runs.models import Run, RunState
from controlplane.runs.ray_jobs import RayJobsError
from controlplane.runs.selectors import job_logs

PAGE_SIZE = 25
LOG_TAIL_LINES = 200


def runs_for(params) -> tuple:
    runs = Run.objects.select_related("experiment", "revision", "created_by")
    filters = {
        "state": params.get("state", ""),
        "experiment": params.get("experiment", ""),
        "user": params.get("user", ""),
        "q": params.get("q", "").strip(),
    }
    if filters["state"] in RunState.values:
        runs = runs.filter(state=filters["state"])
    if filters["experiment"]:
        runs = runs.filter(experiment__name=filters["experiment"])
    if filters["user"]:
        runs = runs.filter(created_by__username=filters["user"])
    if filters["q"]:
        runs = runs.filter(experiment__name__icontains=filters["q"])
    return runs, filters


@guarded
def run_list(request: HttpRequest) -> HttpResponse:
    runs, filters = runs_for(request.GET)
    page = Paginator(runs, PAGE_SIZE).get_page(request.GET.get("page"))
    return render(
        request,
        "runs/run_list.html",
        {"page": page, "filters": filters, "states": RunState.values},
    )


@guarded
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run.objects.select_related("experiment", "revision"), pk=run_id)
    return render(
        request,
        "runs/run_detail.html",
        {
            "run": run,
            "events": run.events.all(),
            "can_stop": may(request.user, "run-stop", "POST") and not run.is_final,
            "can_resume": may(request.user, "run-resume", "POST")
            and run.state == RunState.INTERRUPTED,
            "files": artifacts.list_artifacts(run.pk),
            "other_runs": Run.objects.filter(experiment=run.experiment).exclude(pk=run.pk)[:20],
        },
    )


@guarded
def run_logs(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        text = job_logs(run)
    except RayJobsError as error:
        text = f"(logs unavailable: {error})"
    if request.GET.get("download"):
        response = HttpResponse(text, content_type="text/plain")
        response["Content-Disposition"] = f'attachment; filename="run-{run.pk}.log"'
        return response
    tail = "\n".join(text.splitlines()[-LOG_TAIL_LINES:])
    return render(request, "runs/_logs.html", {"run": run, "tail": tail})


@guarded
def run_stop(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    if not run.is_final:
        request_cancel(run.pk, f"cancelled by {request.user}")
        messages.info(request, f"Stopping run {run.pk}…")
    return redirect("run-detail", run_id=run.pk)


@guarded
def run_resume(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        resume(run.pk, by=request.user)
    except CannotResume as error:
        messages.error(request, str(error))
    else:
        messages.info(request, f"Run {run.pk} resumes from its last checkpoint.")
    return redirect("run-detail", run_id=run.pk)


@guarded
def run_file(request: HttpRequest, run_id: int, path: str) -> FileResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        found = artifacts.artifact_path(run.pk, path)
    except artifacts.ArtifactNotFound:
        raise Http404(f"run {run.pk} has no file {path!r}") from None
    return FileResponse(found.open("rb"), as_attachment=True, filename=found.name)


@guarded
def run_diff(request: HttpRequest, run_id: int, other_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    other = get_object_or_404(Run, pk=other_id)
    lines = config_diff(other.config_yaml, run.config_yaml, f"run {other.pk}", f"run {run.pk}")
    return render(
        request,
        "experiments/diff.html",
        {"title": f"Run {other.pk} → run {run.pk}", "lines": lines, "back_run": run},
    )
