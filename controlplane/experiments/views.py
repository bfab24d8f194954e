from django.contrib import messages
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from controlplane.access.doors import may
from controlplane.access.pages import guarded
from controlplane.experiments import services
from controlplane.experiments.forms import CloneForm, ExperimentForm, LaunchForm, RevisionForm
from controlplane.experiments.models import Experiment
from controlplane.inventory.models import Cluster
from controlplane.inventory.placement_preview import preview_placement
from controlplane.inventory.services import to_trainer_cluster
from controlplane.runs.launch import launch_run
from trainer.config.errors import ConfigError


def problems(error: ConfigError) -> list[dict]:
    return [{"location": p.path, "message": p.message} for p in error.problems]


@guarded
def experiment_list(request: HttpRequest) -> HttpResponse:
    form = ExperimentForm(request.POST or None)
    issues = []
    if request.method == "POST":
        if form.is_valid():
            data = form.cleaned_data
            try:
                experiment = services.create_experiment(
                    data["name"], data["config_yaml"], description=data["description"],
                    tags=data["tags"], author=request.user,
                )  # fmt: skip
            except ConfigError as error:
                issues = problems(error)
            except IntegrityError:
                form.add_error("name", "An experiment with this name exists.")
            else:
                return redirect("experiment-detail", name=experiment.name)
    experiments = Experiment.objects.select_related("created_by").prefetch_related(
        "revisions", "runs"
    )
    return render(
        request,
        "experiments/experiment_list.html",
        {"experiments": experiments, "form": form, "issues": issues},
    )


@guarded
def experiment_detail(request: HttpRequest, name: str) -> HttpResponse:
    experiment = get_object_or_404(Experiment, name=name)
    latest = experiment.latest_revision
    revision_form = RevisionForm(request.POST or None, initial={"config_yaml": latest.config_yaml})
    issues = []
    if request.method == "POST":
        if revision_form.is_valid():
            try:
                revision = services.save_revision(
                    experiment, revision_form.cleaned_data["config_yaml"], author=request.user,
                    message=revision_form.cleaned_data["message"],
                )  # fmt: skip
            except ConfigError as error:
                issues = problems(error)
            else:
                messages.success(request, f"Saved revision {revision.number}.")
                return redirect("experiment-detail", name=experiment.name)
    return render(
        request,
        "experiments/experiment_detail.html",
        {
            "experiment": experiment,
            "revisions": experiment.revisions.select_related("author"),
            "revision_form": revision_form,
            "launch_form": LaunchForm(),
            "clone_form": CloneForm(),
            "issues": issues,
            "runs": experiment.runs.select_related("created_by")[:20],
            "can_write": may(request.user, "experiment-detail", "POST"),
        },
    )


@guarded
def experiment_validate(request: HttpRequest) -> HttpResponse:
    """As-you-type validation of a config (htmx)."""
    try:
        services.validate_config_yaml(request.POST.get("config_yaml", ""))
        issues = []
    except ConfigError as error:
        issues = problems(error)
    return render(request, "inventory/_config_issues.html", {"issues": issues, "checked": True})


@guarded
def revision_diff(request: HttpRequest, name: str) -> HttpResponse:
    experiment = get_object_or_404(Experiment, name=name)
    numbers = sorted(int(n) for n in request.GET.getlist("r") if n.isdigit())[:2]
    if len(numbers) != 2:
        messages.error(request, "Choose two revisions to compare.")
        return redirect("experiment-detail", name=name)
    old, new = (get_object_or_404(experiment.revisions, number=n) for n in numbers)
    lines = services.config_diff(
        old.config_yaml, new.config_yaml, f"r{old.number}", f"r{new.number}"
    )
    return render(
        request,
        "experiments/diff.html",
        {"title": f"{experiment.name}: r{old.number} → r{new.number}", "lines": lines,
         "back": experiment},
    )  # fmt: skip


@guarded
def experiment_clone(request: HttpRequest, name: str) -> HttpResponse:
    source = get_object_or_404(Experiment, name=name)
    form = CloneForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(e for errs in form.errors.values() for e in errs))
        return redirect("experiment-detail", name=name)
    try:
        clone = services.clone_experiment(source, form.cleaned_data["name"], author=request.user)
    except IntegrityError:
        messages.error(request, f"An experiment named {form.cleaned_data['name']} exists.")
        return redirect("experiment-detail", name=name)
    return redirect("experiment-detail", name=clone.name)


@guarded
def experiment_launch(request: HttpRequest, name: str) -> HttpResponse:
    experiment = get_object_or_404(Experiment, name=name)
    form = LaunchForm(request.POST)
    if not form.is_valid():
        messages.error(request, "; ".join(e for errs in form.errors.values() for e in errs))
        return redirect("experiment-detail", name=name)
    data = form.cleaned_data
    try:
        run, _ = launch_run(
            experiment, user=request.user, cluster=data["cluster"],
            overrides=data["overrides"], timeout_s=data["timeout_s"],
        )  # fmt: skip
    except ConfigError as error:
        messages.error(request, "The launch config is invalid: " + str(error))
        return redirect("experiment-detail", name=name)
    return redirect("run-detail", run_id=run.pk)


@guarded
def launch_preview(request: HttpRequest, name: str) -> HttpResponse:
    """The placement grid of the cluster chosen in the launch form (htmx)."""
    cluster = Cluster.objects.filter(name=request.GET.get("cluster", "")).first()
    if cluster is None:
        return HttpResponse('<div id="placement-result" class="muted">No cluster chosen.</div>')
    preview = preview_placement(to_trainer_cluster(cluster), None)
    return render(request, "inventory/_placement_result.html", {"preview": preview})
