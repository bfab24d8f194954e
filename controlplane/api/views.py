"""REST endpoints of the inventory. Invalid cluster configs and placements answer 400
with `{"errors": [...]}`, each error naming its rule, key path, component, segment and
(for YAML) line."""

from django.http import HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.api.serializers import (
    ClusterSerializer,
    ClusterWriteSerializer,
    NodeSerializer,
    PlacementPreviewSerializer,
    RobotSerializer,
)
from controlplane.inventory import services
from controlplane.inventory.models import Cluster
from controlplane.inventory.placement_preview import MAX_PREVIEW_PROCESSES, preview_plan
from controlplane.inventory.selectors import robots
from trainer import cluster as tc


def config_errors(error: tc.ClusterConfigError) -> Response:
    body = {"errors": error.to_list()}
    if isinstance(error, tc.PlanTooLarge):  # the figures, not the plan
        body["summary"] = {"processes": error.processes, "total": error.total,
                           "limit": error.limit}  # fmt: skip
    return Response(body, status=status.HTTP_400_BAD_REQUEST)


class ClusterViewSet(
    mixins.ListModelMixin,
    mixins.RetrieveModelMixin,
    mixins.DestroyModelMixin,
    viewsets.GenericViewSet,
):
    queryset = Cluster.objects.prefetch_related("node_groups__env_configs", "node_groups__robots")
    serializer_class = ClusterSerializer
    lookup_field = "name"

    @extend_schema(request=ClusterWriteSerializer, responses={201: ClusterSerializer})
    def create(self, request: Request) -> Response:
        return self._write(request, status.HTTP_201_CREATED)

    @extend_schema(request=ClusterWriteSerializer, responses={200: ClusterSerializer})
    def update(self, request: Request, name: str) -> Response:
        get_object_or_404(Cluster, name=name)
        return self._write(request, status.HTTP_200_OK, name=name)

    def _write(self, request: Request, success: int, name: str | None = None) -> Response:
        body = ClusterWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            spec = (
                tc.load_cluster_yaml(data["yaml"])
                if "yaml" in data
                else tc.cluster_from_dict(data["config"])
            )
            cluster = services.save_cluster(name or data["name"], spec, data["description"])
        except tc.ClusterConfigError as error:
            return config_errors(error)
        return Response(ClusterSerializer(cluster).data, status=success)

    @extend_schema(responses={200: OpenApiResponse(description="The cluster as YAML")})
    @action(detail=True, methods=["get"])
    def export(self, request: Request, name: str) -> HttpResponse:
        cluster = self.get_object()
        return HttpResponse(services.export_cluster_yaml(cluster), content_type="text/yaml")

    @extend_schema(responses={200: NodeSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def nodes(self, request: Request, name: str) -> Response:
        page = self.paginate_queryset(self.get_object().nodes.all())
        return self.get_paginated_response(NodeSerializer(page, many=True).data)


class RobotViewSet(viewsets.ReadOnlyModelViewSet):
    queryset = robots()
    serializer_class = RobotSerializer


class PlacementPreviewView(APIView):
    @extend_schema(
        request=PlacementPreviewSerializer,
        responses={
            200: OpenApiResponse(description="{plan: {num_nodes, components: {name: …}}}"),
            400: OpenApiResponse(
                description="{errors: [{rule, message, location, line, …}]}; past "
                f"{MAX_PREVIEW_PROCESSES:,} processes also {{summary: {{processes: "
                "{component: count}, total, limit}}}"
            ),
        },
    )
    def post(self, request: Request) -> Response:
        body = PlacementPreviewSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            if "cluster" in data:
                cluster = get_object_or_404(Cluster, name=data["cluster"])
                spec = services.to_trainer_cluster(cluster)
            else:
                spec = tc.load_cluster_yaml(data["cluster_yaml"])
            plan = preview_plan(spec, data.get("placement"))
        except tc.ClusterConfigError as error:
            return config_errors(error)
        return Response({"plan": plan.to_dict()})
