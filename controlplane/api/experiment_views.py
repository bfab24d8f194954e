"""REST endpoints of experiments and their revisions. An invalid config answers 400
with `{"errors": [{"path", "message"}]}`, each naming its key path."""

from django.db import IntegrityError
from drf_spectacular.utils import extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.serializers import (
    ExperimentSerializer,
    ExperimentWriteSerializer,
    RevisionSerializer,
    RevisionWriteSerializer,
)
from controlplane.experiments import services
from controlplane.experiments.models import Experiment
from trainer.config.errors import ConfigError
from trainer.config.source_lines import problem_lines


def config_problems(error: ConfigError, text: str = "") -> Response:
    """400 listing every problem by key path, with its line in `text` where known."""
    lines = problem_lines(error.problems, text)
    errors = [
        {"path": p.location, "message": p.message, "line": line}
        for p, line in zip(error.problems, lines, strict=True)
    ]
    return Response({"errors": errors}, status=status.HTTP_400_BAD_REQUEST)


class ExperimentViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Experiment.objects.select_related("created_by").prefetch_related("revisions")
    serializer_class = ExperimentSerializer
    lookup_field = "name"

    @extend_schema(request=ExperimentWriteSerializer, responses={201: ExperimentSerializer})
    def create(self, request: Request) -> Response:
        body = ExperimentWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        try:
            experiment = services.create_experiment(
                data["name"], data["config_yaml"], description=data["description"],
                tags=data["tags"], author=request.user,
            )  # fmt: skip
        except ConfigError as error:
            return config_problems(error, data["config_yaml"])
        except IntegrityError:
            return Response(
                {"name": [f"An experiment named {data['name']!r} exists."]},
                status=status.HTTP_400_BAD_REQUEST,
            )
        return Response(ExperimentSerializer(experiment).data, status=status.HTTP_201_CREATED)

    @extend_schema(responses={200: RevisionSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def revisions(self, request: Request, name: str) -> Response:
        page = self.paginate_queryset(self.get_object().revisions.select_related("author"))
        return self.get_paginated_response(RevisionSerializer(page, many=True).data)

    @extend_schema(request=RevisionWriteSerializer, responses={201: RevisionSerializer})
    @revisions.mapping.post
    def add_revision(self, request: Request, name: str) -> Response:
        experiment = self.get_object()
        body = RevisionWriteSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        latest = experiment.latest_revision
        try:
            revision = services.save_revision(
                experiment, body.validated_data["config_yaml"], author=request.user,
                message=body.validated_data["message"],
            )  # fmt: skip
        except ConfigError as error:
            return config_problems(error, body.validated_data["config_yaml"])
        unchanged = latest is not None and revision.pk == latest.pk
        return Response(
            RevisionSerializer(revision).data,
            status=status.HTTP_200_OK if unchanged else status.HTTP_201_CREATED,
        )
