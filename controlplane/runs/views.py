from django.contrib import messages
from django.core.paginator import Paginator
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.html import format_html

from controlplane.access.pages import guarded, refused_status
from controlplane.experiments.services import config_diff
from controlplane.runs import artifacts
from controlplane.runs.cancellation import request_cancel
from controlplane.runs.compare_summary import compare_summary
from controlplane.runs.episodes import (
    EpisodeNotFound,
    episode_grid,
    open_video,
    shared_states,
    side_by_side,
    video_response,
)
from controlplane.runs.eval_tables import compared_evaluations
from controlplane.runs.evaluations import EvaluationRefused, request_evaluation
from controlplane.runs.forms import EvaluateForm
from controlplane.runs.interruption import CannotResume, resume
from controlplane.runs.log_text import as_html
from controlplane.runs.models import Run, RunKind, RunState
from controlplane.runs.ray_jobs import RayJobsError
from controlplane.runs.run_columns import ChosenColumns, offered_keys
from controlplane.runs.run_filters import RunFilterSet, chosen, problems
from controlplane.runs.run_logs import downloads_refused, log_download, panel_tail, polls_refused
from controlplane.runs.run_page import (
    BadRunIds,
    ConfigError,
    chart_context,
    config_differences,
    config_problem,
    evaluations_context,
    has_console,
    live_fragments,
    runs_to_compare,
    seen_fragments,
    template_names,
)
from controlplane.runs.selectors import listed_runs, with_figures
from trainer.config.addresses import redact_urls_in

PAGE_SIZE = 25
ORDERING_LABELS = {
    "-created": "newest first",
    "created": "oldest first",
    "-success": "highest success",
    "success": "lowest success",
    "-duration": "longest",
    "duration": "shortest",
}


@guarded
def run_list(request: HttpRequest) -> HttpResponse:
    """The runs list: the API's filters and orderings (runs.run_filters), the chosen
    config and metric columns, sortable (runs.run_columns), page numbers."""
    filterset = RunFilterSet(request.GET, queryset=listed_runs())
    wrong = problems(filterset)
    if wrong:  # the newest runs, and what was wrong
        filterset = RunFilterSet({}, queryset=listed_runs())
    columns = ChosenColumns.from_query(request.GET)
    problem = "; ".join([*(f"{name}: {text}" for name, text in wrong.items()),
                         *columns.problems])  # fmt: skip
    page = Paginator(columns.applied(filterset.qs), PAGE_SIZE).get_page(request.GET.get("page"))
    for run in page:
        run.chosen_cells = columns.cells(run)
    query = request.GET.copy()
    query.pop("page", None)
    return render(
        request,
        "runs/run_list.html",
        {
            "page": page,
            "page_numbers": page.paginator.get_elided_page_range(page.number),
            "query": query.urlencode(),
            "filters": chosen(filterset),
            "problem": problem,
            "states": RunState.values,
            "kinds": RunKind.values,
            "orderings": ORDERING_LABELS,
            "columns": columns.headers(query),
            "chosen_specs": [column.spec for column in columns.columns],
            "sort": request.GET.get("sort", "") if columns.sort else "",
            "sorted_column": columns.sort,
            "offered_keys": offered_keys(list(page)),
        },
    )


@guarded
def run_detail(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(
        with_figures(Run.objects.select_related("experiment", "revision")), pk=run_id
    )
    return _run_page(request, run)


def _run_page(request: HttpRequest, run: Run, eval_form: EvaluateForm | None = None):
    """The run's page; a refused Evaluate form shows it again as it was filled in (422).

    Its live parts are the very fragments its socket sends (`live_fragments`), and the
    socket is told their digests: it then swaps only what changed after this render."""
    fragments = live_fragments(run.pk, request.user)
    shown = dict(fragments)
    if eval_form is not None:  # as it was filled in, with what is wrong with it
        context = {"run": run, **evaluations_context(run, request.user, eval_form)}
        shown["run-evaluations"] = render_to_string("runs/_evaluations.html", context, request)
    return render(
        request,
        "runs/run_detail.html",
        {
            "run": run,
            # Passwords in camera URLs are the run's to use, nobody's to read.
            "config_yaml": redact_urls_in(run.config_yaml),
            "overrides": [redact_urls_in(override) for override in run.overrides or []],
            "fragments": template_names(shown),
            "seen_fragments": seen_fragments(fragments),
            "config_problem": config_problem(run),
            "chart_context": {**chart_context(run), "now": timezone.now().isoformat()},
            "has_console": has_console(run),
            "other_runs": Run.objects.filter(experiment=run.experiment).exclude(pk=run.pk)[:20],
        },
        status=refused_status(request, eval_form is not None and eval_form.errors),
    )


@guarded
def run_evaluate(request: HttpRequest, run_id: int) -> HttpResponse:
    """Launch an eval run of this run's checkpoint, or show the page again with what is
    wrong with the form."""
    source = get_object_or_404(Run.objects.select_related("experiment", "revision"), pk=run_id)
    form = EvaluateForm(request.POST)
    if form.is_valid():
        try:
            run, _ = request_evaluation(source, form.request(), user=request.user)
        except EvaluationRefused as error:
            if source.is_eval:  # its page has no form to show the problem beside
                messages.error(request, error.problems["run"])
                return redirect("run-detail", run_id=source.pk)
            for name, problem in error.problems.items():
                form.add_error(name if name in form.fields else None, problem)
        else:
            messages.info(
                request, f"Run {run.pk} evaluates run {source.pk}'s checkpoint of iteration "
                f"{run.source_iteration}.",
            )  # fmt: skip
            return redirect("run-detail", run_id=run.pk)
    return _run_page(request, source, eval_form=form)


@guarded
def run_logs(request: HttpRequest, run_id: int) -> HttpResponse:
    """The log panel's last lines, or with `?download=1` the whole log, streamed
    (runs/run_logs.py: what each costs, the cache, the per-user limits)."""
    run = get_object_or_404(Run, pk=run_id)
    if request.GET.get("download"):
        refused = downloads_refused(request.user)
        if refused is not None:
            return refused
        try:
            escapes = request.GET.get("ansi") == "1"  # as the job wrote it, colours too
            return log_download(run, filename=f"run-{run.pk}.log", escapes=escapes)
        except RayJobsError as error:
            return HttpResponse(f"logs unavailable: {error}", status=503,
                                content_type="text/plain; charset=utf-8")  # fmt: skip
    refused = polls_refused(request.user)
    if refused is not None:
        return refused
    try:
        tail = panel_tail(run)
    except RayJobsError as error:
        tail = f"(logs unavailable: {error})"
    lines = len(tail.splitlines())
    return render(request, "runs/_logs.html", {"run": run, "tail": as_html(tail), "lines": lines})


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
        found = artifacts.open_artifact(run.pk, path)
    except artifacts.ArtifactNotFound:
        raise Http404(f"run {run.pk} has no file {path!r}") from None
    return artifacts.download_response(found, path)


@guarded
def run_episodes(request: HttpRequest, run_id: int) -> HttpResponse:
    """The run page's episode grid (htmx: on its filters' change, and every few
    seconds for new episodes)."""
    run = get_object_or_404(Run, pk=run_id)
    return render(request, "runs/_episodes.html", episode_grid(run, request.GET))


@guarded
def compare_episodes(request: HttpRequest) -> HttpResponse:
    """The compared runs' episodes of one task and init state, side by side (htmx)."""
    try:
        runs = runs_to_compare(request.GET.get("ids", ""))
        task, state = (int(part) for part in request.GET.get("state", "").split(":"))
    except (BadRunIds, ValueError) as error:
        problem = str(error) if isinstance(error, BadRunIds) else "pick a task and init state"
        return HttpResponse(format_html('<p class="error" role="alert">{}</p>', problem))
    context = {"pairs": side_by_side(runs, task, state), "task": task, "state": state}
    return render(request, "runs/_episodes_side_by_side.html", context)


@guarded
def run_episode_video(request: HttpRequest, run_id: int, name: str) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        found = open_video(run, name)
    except EpisodeNotFound:
        raise Http404(f"run {run.pk} has no episode video {name!r}") from None
    return video_response(request, found)


@guarded
def run_diff(request: HttpRequest, run_id: int, other_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    other = get_object_or_404(Run, pk=other_id)
    lines = config_diff(redact_urls_in(other.config_yaml), redact_urls_in(run.config_yaml),
                        f"run {other.pk}", f"run {run.pk}")  # fmt: skip
    return render(
        request,
        "experiments/diff.html",
        {"title": f"Run {other.pk} → run {run.pk}", "lines": lines, "back_run": run},
    )


@guarded
def run_compare(request: HttpRequest) -> HttpResponse:
    """Overlay the charts of the runs in `?ids=1,2,…`."""
    ids = request.GET.get("ids", "")
    try:
        runs = runs_to_compare(ids)
    except BadRunIds as error:
        return render(request, "runs/compare.html", {"error": str(error), "ids": ids}, status=400)
    try:
        differences, differences_error = config_differences(runs), None
    except ConfigError as error:
        differences, differences_error = [], f"A run's stored config cannot be read: {error}"
    return render(
        request,
        "runs/compare.html",
        {
            "runs": runs,
            "compared": [chart_context(run) for run in runs],
            "summary": compare_summary(runs),
            "shared_states": shared_states(runs),
            "differences": differences,
            "differences_error": differences_error,
            "evaluations": compared_evaluations(runs),
            "ids": ids,
        },
    )
