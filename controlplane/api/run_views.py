"""REST endpoints of runs: launch (with an Idempotency-Key), status, cancel, resume,
logs, events, metrics and the run's files."""

from django.db.models import OuterRef, Subquery
from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.experiment_views import config_problems
from controlplane.api.serializers import ArtifactSerializer, RunCreateSerializer, RunSerializer
from controlplane.experiments.models import Experiment
from controlplane.inventory.models import Cluster
from controlplane.runs import artifacts, dispatch
from controlplane.runs.cancellation import request_cancel
from controlplane.runs.interruption import CannotResume, resume
from controlplane.runs.launch import launch_run
from controlplane.runs.models import Run, RunState
from controlplane.runs.ray_jobs import RayJobsError
from controlplane.runs.selectors import job_logs
from trainer.config.errors import ConfigError

MAX_IDEMPOTENCY_KEY = 200


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = RunSerializer

    def get_queryset(self):
        runs = Run.objects.select_related("experiment", "revision", "cluster", "created_by")
        state = self.request.query_params.get("state")
        if state:
            if state not in RunState.values:
                raise ValidationError({"state": f"Unknown state; use one of {RunState.values}."})
            runs = runs.filter(state=state)
        experiment = self.request.query_params.get("experiment")
        if experiment:
            runs = runs.filter(experiment__name=experiment)
        return runs

    @extend_schema(
        request=RunCreateSerializer,
        responses={201: RunSerializer, 200: RunSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def create(self, request: Request) -> Response:
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        key = request.headers.get("Idempotency-Key") or None
        if key and len(key) > MAX_IDEMPOTENCY_KEY:
            raise ValidationError({"Idempotency-Key": f"At most {MAX_IDEMPOTENCY_KEY} characters."})
        experiment = get_object_or_404(Experiment, name=data["experiment"])
        revision = None
        if "revision" in data:
            revision = get_object_or_404(experiment.revisions, number=data["revision"])
        cluster = get_object_or_404(Cluster, name=data["cluster"]) if "cluster" in data else None
        try:
            run, created = launch_run(
                experiment, user=request.user, revision=revision, cluster=cluster,
                overrides=data["overrides"], idempotency_key=key,
                timeout_s=data.get("timeout_s"),
            )  # fmt: skip
        except ConfigError as error:
            return config_problems(error)
        return Response(
            RunSerializer(run).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={202: RunSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        run = request_cancel(self.get_object().pk, f"cancelled by {request.user}")
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: RunSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def resume(self, request: Request, pk: str) -> Response:
        try:
            run = resume(self.get_object().pk, by=request.user)
        except CannotResume as error:
            return Response({"detail": str(error)}, status=status.HTTP_409_CONFLICT)
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: RunSerializer})
    @action(detail=True, methods=["post"])
    def reconcile(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        dispatch.reconcile_later(run.pk)
        return Response(RunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses={200: str, 503: None})
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str) -> HttpResponse:
        try:
            text = job_logs(self.get_object())
        except RayJobsError as error:
            return HttpResponse(f"logs unavailable: {error}", status=503, content_type="text/plain")
        return HttpResponse(text, content_type="text/plain")

    @extend_schema(responses={200: ArtifactSerializer(many=True)})
    @action(detail=True, methods=["get"])
    def artifacts(self, request: Request, pk: str) -> Response:
        """The run's files (checkpoints, metrics, config…) with their sizes."""
        files = artifacts.list_artifacts(self.get_object().pk)
        return Response(ArtifactSerializer(files, many=True).data)

    @extend_schema(responses={(200, "application/octet-stream"): bytes})
    @action(detail=True, methods=["get"], url_path=r"artifacts/(?P<path>.+)")
    def artifact(self, request: Request, pk: str, path: str) -> FileResponse:
        """Download one of the run's files."""
        try:
            found = artifacts.artifact_path(self.get_object().pk, path)
        except artifacts.ArtifactNotFound:
            raise Http404(f"run {pk} has no file {path!r}") from None
        return FileResponse(found.open("rb"), as_attachment=True, filename=found.name)

    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str) -> Response:
        events = self.get_object().events.values("kind", "message", "data", "created_at")
        return Response(list(events))

    @extend_schema(parameters=[OpenApiParameter("key", str, description="a series by key")])
    @action(detail=True, methods=["get"])
    def metrics(self, request: Request, pk: str) -> Response:
        run = self.get_object()
        key = request.query_params.get("key")
        if key:
            points = run.metrics.filter(key=key).order_by("step")
            return Response(
                {"key": key, "points": list(points.values("step", "value", "wall_time"))}
            )
        # One query: each key's point at its highest step.
        last_step = run.metrics.filter(key=OuterRef("key")).order_by("-step").values("step")[:1]
        points = run.metrics.filter(step=Subquery(last_step)).values("key", "step", "value")
        latest = {p["key"]: {"step": p["step"], "value": p["value"]} for p in points}
        return Response({"latest": latest})
