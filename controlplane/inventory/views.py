from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render

from controlplane.access.doors import may
from controlplane.access.pages import guarded, refused_status
from controlplane.console.selectors import inventory_robots_with_status, robots_online
from controlplane.inventory import services
from controlplane.inventory.forms import ClusterImportForm, ClusterYamlForm
from controlplane.inventory.live_cluster import live_cluster
from controlplane.inventory.models import Cluster
from controlplane.inventory.placement_preview import preview_placement
from controlplane.inventory.selectors import get_cluster, placement_yaml
from trainer import cluster as tc


@guarded
def cluster_list(request: HttpRequest) -> HttpResponse:
    form = ClusterImportForm(request.POST or None, request.FILES or None)
    issues = []
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        try:
            cluster = services.import_cluster_yaml(
                data["name"], data["yaml_text"], data["description"]
            )
        except tc.ClusterConfigError as error:
            issues = error.to_list()
        else:
            return redirect("cluster-detail", name=cluster.name)
    clusters = Cluster.objects.prefetch_related("node_groups")
    return render(
        request,
        "inventory/cluster_list.html",
        {
            "clusters": clusters,
            "form": form,
            "issues": issues,
            "can_import": may(request.user, "cluster-list", "POST"),
        },
        status=refused_status(request, issues or form.errors),
    )


@guarded
def cluster_detail(request: HttpRequest, name: str) -> HttpResponse:
    cluster = get_cluster(name)
    groups = cluster.node_groups.prefetch_related("env_configs", "robots")
    return render(
        request,
        "inventory/cluster_detail.html",
        {
            "cluster": cluster,
            "groups": groups,
            "nodes": cluster.nodes.all()[:500],
            "can_edit": may(request.user, "cluster-edit", "POST"),
        },
    )


@guarded
def cluster_live(request: HttpRequest, name: str) -> HttpResponse:
    """The cluster's live Ray nodes (htmx, every few seconds)."""
    return render(request, "inventory/_live_nodes.html", {"live": live_cluster(get_cluster(name))})


@guarded
def cluster_export(request: HttpRequest, name: str) -> HttpResponse:
    cluster = get_cluster(name)
    response = HttpResponse(services.export_cluster_yaml(cluster), content_type="text/yaml")
    response["Content-Disposition"] = f'attachment; filename="{cluster.name}.yaml"'
    return response


@guarded
def cluster_edit(request: HttpRequest, name: str) -> HttpResponse:
    cluster = get_cluster(name)
    text, stored_problems = services.editable_cluster_yaml(cluster)
    form = ClusterYamlForm(request.POST or None, initial={"yaml_text": text})
    # Rows edited into an invalid cluster are shown as they are, with what to fix.
    issues = [problem.to_dict() for problem in stored_problems]
    if request.method == "POST" and form.is_valid():
        try:
            services.import_cluster_yaml(cluster.name, form.cleaned_data["yaml_text"])
        except tc.ClusterConfigError as error:
            issues = error.to_list()
        else:
            return redirect("cluster-detail", name=cluster.name)
    return render(
        request,
        "inventory/cluster_edit.html",
        {"cluster": cluster, "form": form, "issues": issues},
        status=refused_status(request, issues or form.errors),
    )


@guarded
def cluster_validate(request: HttpRequest) -> HttpResponse:
    """As-you-type validation of a cluster YAML (htmx)."""
    try:
        tc.load_cluster_yaml(request.POST.get("yaml_text", ""))
        issues = []
    except tc.ClusterConfigError as error:
        issues = error.to_list()
    return render(
        request,
        "inventory/_config_issues.html",
        {"issues": issues, "checked": True},
        status=refused_status(request, issues),
    )


@guarded
def placement_page(request: HttpRequest, name: str) -> HttpResponse:
    cluster = get_cluster(name)
    spec = services.to_trainer_cluster(cluster)
    text = placement_yaml(cluster.component_placement)
    return render(
        request,
        "inventory/placement.html",
        {"cluster": cluster, "placement_text": text, "preview": preview_placement(spec, text)},
    )


@guarded
def placement_preview_fragment(request: HttpRequest, name: str) -> HttpResponse:
    """The grid (or the errors) for the placement being typed (htmx)."""
    spec = services.to_trainer_cluster(get_cluster(name))
    preview = preview_placement(spec, request.POST.get("placement", ""))
    return render(
        request,
        "inventory/_placement_result.html",
        {"preview": preview},
        status=refused_status(request, preview.errors),
    )


@guarded
def robot_list(request: HttpRequest) -> HttpResponse:
    listed = inventory_robots_with_status()
    names = {robot.name for robot, _ in listed}
    simulated = [online for online in robots_online() if online.robot["name"] not in names]
    context = {"robots": listed, "simulated": simulated}
    return render(request, "inventory/robot_list.html", context)
