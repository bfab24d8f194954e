from django.contrib import messages
from django.db import IntegrityError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render

from controlplane.access.doors import may
from controlplane.access.pages import guarded, refused_status
from controlplane.experiments import services
from controlplane.experiments.forms import CloneForm, ExperimentForm, LaunchForm, RevisionForm
from controlplane.experiments.models import Experiment
from controlplane.inventory.models import Cluster
from controlplane.inventory.placement_preview import preview_placement
from controlplane.inventory.services import to_trainer_cluster
from controlplane.runs.launch import launch_run
from trainer.config.errors import ConfigError
from trainer.config.source_lines import problem_lines


def problems(error: ConfigError, text: str = "") -> list[dict]:
    """The problems of a config as the issue list shows them, each with its YAML line
    where `text` (the config as typed) has the key."""
    lines = problem_lines(error.problems, text)
    return [
        {"location": p.location, "message": p.message, "line": line}
        for p, line in zip(error.problems, lines, strict=True)
    ]


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
                issues = problems(error, data["config_yaml"])
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
        status=refused_status(request, issues or form.errors),
    )


@guarded
def experiment_detail(request: HttpRequest, name: str) -> HttpResponse:
    experiment = get_object_or_404(Experiment, name=name)
    latest = experiment.latest_revision
    revision_form = RevisionForm(request.POST or None, initial={"config_yaml": latest.config_yaml})
    issues = []
    if request.method == "POST":
        if revision_form.is_valid():
            text = revision_form.cleaned_data["config_yaml"]
            try:
                revision = services.save_revision(
                    experiment, text, author=request.user,
                    message=revision_form.cleaned_data["message"],
                )  # fmt: skip
            except ConfigError as error:
                issues = problems(error, text)
            else:
                messages.success(request, f"Saved revision {revision.number}.")
                return redirect("experiment-detail", name=experiment.name)
    return _detail_page(request, experiment, revision_form=revision_form, issues=issues)


def _detail_page(
    request: HttpRequest,
    experiment: Experiment,
    *,
    revision_form: RevisionForm | None = None,
    launch_form: LaunchForm | None = None,
    issues: list[dict] | None = None,
) -> HttpResponse:
    """The experiment page; a rejected save or launch shows it again with what was typed
    (and answers 422)."""
    initial = {"config_yaml": experiment.latest_revision.config_yaml}
    revision_form = revision_form or RevisionForm(initial=initial)
    launch_form = launch_form or LaunchForm()
    refused = issues or revision_form.errors or launch_form.errors
    return render(
        request,
        "experiments/experiment_detail.html",
        {
            "experiment": experiment,
            "revisions": experiment.revisions.select_related("author"),
            "revision_form": revision_form,
            "launch_form": launch_form,
            "clone_form": CloneForm(),
            "issues": issues or [],
            "runs": experiment.runs.select_related("created_by")[:20],
            "can_write": may(request.user, "experiment-detail", "POST"),
        },
        status=refused_status(request, refused),
    )


@guarded
def experiment_validate(request: HttpRequest) -> HttpResponse:
    """As-you-type validation of a config (htmx)."""
    text = request.POST.get("config_yaml", "")
    try:
        services.validate_config_yaml(text, request.user)
        issues = []
    except ConfigError as error:
        issues = problems(error, text)
    return render(
        request,
        "inventory/_config_issues.html",
        {"issues": issues, "checked": True},
        status=refused_status(request, issues),
    )


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
    except ConfigError as error:
        messages.error(request, f"The clone is refused: {error}")
        return redirect("experiment-detail", name=name)
    except IntegrityError:
        messages.error(request, f"An experiment named {form.cleaned_data['name']} exists.")
        return redirect("experiment-detail", name=name)
    return redirect("experiment-detail", name=clone.name)


@guarded
def experiment_launch(request: HttpRequest, name: str) -> HttpResponse:
    return _launch(request, get_object_or_404(Experiment, name=name))


@guarded
def run_launch(request: HttpRequest) -> HttpResponse:
    """The launch dialog of pages that do not belong to one experiment (Home)."""
    experiment = Experiment.objects.filter(name=request.POST.get("experiment", "")).first()
    if experiment is None:
        messages.error(request, "Choose an experiment to launch.")
        return redirect("home")
    return _launch(request, experiment)


def _launch(request: HttpRequest, experiment: Experiment) -> HttpResponse:
    """Launch, or show the experiment page again with the form as the user filled it and
    what is wrong with it."""
    form = LaunchForm(request.POST)
    if form.is_valid():
        data = form.cleaned_data
        try:
            run, _ = launch_run(
                experiment, user=request.user, cluster=data["cluster"],
                overrides=data["overrides"], timeout_s=data["timeout_s"], tags=data["tags"],
            )  # fmt: skip
        except ConfigError as error:
            form.add_error(None, "The launch config is invalid: " + str(error))
        else:
            return redirect("run-detail", run_id=run.pk)
    return _detail_page(request, experiment, launch_form=form)


@guarded
def launch_preview(request: HttpRequest, name: str = "") -> HttpResponse:
    """The placement grid of the cluster chosen in a launch form (htmx): an
    experiment's, or Home's dialog (the plan is the cluster's, whatever the experiment)."""
    cluster = Cluster.objects.filter(name=request.GET.get("cluster", "")).first()
    preview = preview_placement(to_trainer_cluster(cluster), None) if cluster else None
    return render(request, "inventory/_placement_result.html", {"preview": preview})
