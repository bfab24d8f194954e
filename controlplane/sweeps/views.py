"""The sweeps' pages: the list, one sweep (live), a new sweep of an experiment, and the
buttons that cancel one or write its best trial into a revision. Thin: the work is
services.py's, what is shown page.py's."""

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render, resolve_url
from django_htmx.http import HttpResponseClientRedirect

from controlplane.access.pages import guarded
from controlplane.experiments.models import Experiment
from controlplane.sweeps import services
from controlplane.sweeps.models import Sweep
from controlplane.sweeps.page import FRAGMENTS, chart_data, sweep_context
from trainer.config.errors import ConfigError
from trainer.config.source_lines import problem_lines

# What the form starts from: a search that suits most experiments, to edit.
STARTING_SPEC = """\
space:
  actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
  algorithm.clip_ratio: {uniform: [0.1, 0.3]}
objective: {metric: rollout/success_rate, direction: max, last: 3}
budget: {trials: 8, parallel: 2}
sampler: tpe      # or random, grid
pruner: median    # or halving, none
"""


@guarded
def sweep_list(request: HttpRequest) -> HttpResponse:
    sweeps = Sweep.objects.select_related("experiment", "revision", "created_by")[:200]
    return render(request, "sweeps/sweep_list.html", {"sweeps": sweeps})


@guarded
def sweep_detail(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = get_object_or_404(Sweep.objects.select_related("experiment", "revision"), pk=sweep_id)
    context = sweep_context(sweep, request.user)
    return render(request, "sweeps/sweep_detail.html",
                  {**context, "fragments": FRAGMENTS, "charts": chart_data(sweep)})  # fmt: skip


@guarded
def sweep_new(request: HttpRequest, name: str) -> HttpResponse:
    """The form (GET); a sweep started from it (POST), or the form again with every
    problem at its key and line (422)."""
    experiment = get_object_or_404(Experiment, name=name)
    text = request.POST.get("spec", "") if request.method == "POST" else STARTING_SPEC
    problems = []
    if request.method == "POST":
        try:
            sweep, _ = services.create_sweep(experiment, text, user=request.user)
        except ConfigError as error:
            lines = problem_lines(error.problems, text)
            problems = [{"path": p.location, "message": p.message, "line": line}
                        for p, line in zip(error.problems, lines, strict=True)]  # fmt: skip
        else:
            return redirect("sweep-detail", sweep_id=sweep.pk)
    return render(
        request, "sweeps/sweep_new.html",
        {"experiment": experiment, "spec_text": text, "problems": problems},
        status=422 if problems else 200,
    )  # fmt: skip


def _go(request: HttpRequest, to: str, **kwargs) -> HttpResponse:
    """A redirect; for htmx (the buttons of the live header), one the page follows."""
    url = resolve_url(to, **kwargs)
    return HttpResponseClientRedirect(url) if request.htmx else redirect(url)


@guarded
def sweep_cancel(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = services.cancel_sweep(get_object_or_404(Sweep, pk=sweep_id))
    if not sweep.is_final:
        messages.info(request, f"Stopping sweep {sweep.pk}: its running trials are cancelled.")
    return _go(request, "sweep-detail", sweep_id=sweep.pk)


@guarded
def sweep_best_revision(request: HttpRequest, sweep_id: int) -> HttpResponse:
    sweep = get_object_or_404(Sweep.objects.select_related("experiment"), pk=sweep_id)
    try:
        revision = services.revision_from_best(sweep, request.user)
    except ConfigError as error:
        messages.error(request, str(error))
        return _go(request, "sweep-detail", sweep_id=sweep.pk)
    messages.info(request, f"Revision {revision.number}: {revision.message}")
    return _go(request, "experiment-detail", name=sweep.experiment.name)
