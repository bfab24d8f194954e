"""REST endpoints of runs: launch (with an Idempotency-Key), status, cancel, resume,
logs, events, metrics and the run's files."""

from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import get_object_or_404
from django_filters.rest_framework import DjangoFilterBackend
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import PageNumberPagination
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.experiment_views import config_problems
from controlplane.api.query_serializers import (
    BucketsQuery,
    EventsQuery,
    PointsQuery,
    SeriesQuery,
    read_query,
)
from controlplane.api.renderers import SERIES_RENDERERS
from controlplane.api.serializers import (
    ArtifactSerializer,
    EpisodePageSerializer,
    EvalTableSerializer,
    EvaluateSerializer,
    EvaluationListSerializer,
    RunCreateSerializer,
    RunSerializer,
)
from controlplane.experiments.models import Experiment
from controlplane.inventory.models import Cluster
from controlplane.runs import artifacts, dispatch, run_events, success_rates
from controlplane.runs import series as metric_series
from controlplane.runs.cancellation import request_cancel
from controlplane.runs.episodes import (
    EpisodeNotFound,
    filters_from_query,
    kept_names,
    open_video,
    shown,
    video_response,
)
from controlplane.runs.episodes import episodes as episodes_of
from controlplane.runs.eval_tables import evaluations_of, table_of
from controlplane.runs.evaluations import EvalRequest, EvaluationRefused, request_evaluation
from controlplane.runs.interruption import CannotResume, resume
from controlplane.runs.launch import launch_run
from controlplane.runs.models import Run
from controlplane.runs.ray_jobs import RayJobsError
from controlplane.runs.run_filters import RunFilterSet
from controlplane.runs.run_logs import downloads_refused, log_download
from controlplane.runs.selectors import listed_runs, with_figures
from trainer.config.errors import ConfigError

MAX_IDEMPOTENCY_KEY = 200

EPISODE_FILTERS = [
    OpenApiParameter("task", int, required=False, description="only this task's episodes"),
    OpenApiParameter("horizon", int, required=False, description="only this planning horizon"),
    OpenApiParameter("outcome", str, enum=["success", "failure"], required=False),
    OpenApiParameter("human", int, enum=[0, 1], required=False,
                     description="1: an operator acted in it; 0: the policy alone"),
    OpenApiParameter("first", int, required=False, description="from this iteration on"),
    OpenApiParameter("last", int, required=False, description="up to this iteration"),
    OpenApiParameter("page", int, required=False),
    OpenApiParameter("page_size", int, required=False, description="at most 200"),
]  # fmt: skip


class EpisodePagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class RunPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class RunViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = RunSerializer

    pagination_class = RunPagination
    filter_backends = [DjangoFilterBackend]
    filterset_class = RunFilterSet

    def get_queryset(self):
        if self.action != "list":
            return with_figures(Run.objects.select_related("experiment", "revision", "cluster"))
        return listed_runs().select_related("cluster")

    def filter_queryset(self, queryset):
        # The list's filters only: a run's own reads (get_object) build no FilterSet.
        return super().filter_queryset(queryset) if self.action == "list" else queryset

    @extend_schema(
        request=RunCreateSerializer,
        responses={201: RunSerializer, 200: RunSerializer},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def create(self, request: Request) -> Response:
        body = RunCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        key = idempotency_key(request)
        experiment = get_object_or_404(Experiment, name=data["experiment"])
        revision = None
        if "revision" in data:
            revision = get_object_or_404(experiment.revisions, number=data["revision"])
        cluster = get_object_or_404(Cluster, name=data["cluster"]) if "cluster" in data else None
        try:
            run, created = launch_run(
                experiment, user=request.user, revision=revision, cluster=cluster,
                overrides=data["overrides"], idempotency_key=key,
                timeout_s=data.get("timeout_s"), tags=data["tags"],
            )  # fmt: skip
        except ConfigError as error:
            return config_problems(error)
        return Response(
            RunSerializer(run).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(
        request=EvaluateSerializer,
        responses={201: RunSerializer, 200: RunSerializer, 400: None},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    @action(detail=True, methods=["post"])
    def evaluate(self, request: Request, pk: str) -> Response:
        """Launch an eval run of this run's checkpoint (`python -m trainer eval`). A
        request that cannot run answers 400 naming each field that is wrong."""
        source = self.get_object()
        body = EvaluateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        key = idempotency_key(request)
        wanted = EvalRequest(data.get("checkpoint"), data.get("suite"), data.get("tasks"),
                             data.get("states"))  # fmt: skip
        try:
            run, created = request_evaluation(
                source, wanted, user=request.user, idempotency_key=key,
                timeout_s=data.get("timeout_s"),
            )  # fmt: skip
        except EvaluationRefused as error:
            raise ValidationError({name: [text] for name, text in error.problems.items()}) from None
        return Response(
            RunSerializer(run).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(responses={200: EvalTableSerializer, 404: None})
    @action(detail=True, methods=["get"])
    def evaluation(self, request: Request, pk: str) -> Response:
        """An eval run's per-task table (`table` is null until the trainer reports it)."""
        run = self.get_object()
        if not run.is_eval:
            raise Http404(
                f"run {run.pk} is a training run; its evaluations are at "
                f"/api/v1/runs/{run.pk}/evaluations"
            )
        return Response({
            "run": run.pk, "source_run": run.source_run_id, "checkpoint": run.source_iteration,
            "state": run.state, "options": run.eval_options, "table": table_of(run),
        })  # fmt: skip

    @extend_schema(responses={200: EvaluationListSerializer})
    @action(detail=True, methods=["get"])
    def evaluations(self, request: Request, pk: str) -> Response:
        """The run's evaluations (eval runs of its checkpoints), newest first, with their
        suite averages."""
        found = evaluations_of(self.get_object())
        return Response({"results": [evaluation.to_json() for evaluation in found]})

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

    @extend_schema(
        parameters=[OpenApiParameter(
            "ansi", int, enum=[0, 1], required=False,
            description="1: keep the terminal escapes (colours) as the job wrote them",
        )],
        responses={(200, "text/plain"): str, 429: None, 503: None},
    )  # fmt: skip
    @action(detail=True, methods=["get"])
    def logs(self, request: Request, pk: str) -> HttpResponse:
        """The run's whole job log (its current attempt), streamed as Ray sends it, as
        plain text (terminal escapes removed) unless `ansi=1`."""
        run = self.get_object()
        refused = downloads_refused(request.user)
        if refused is not None:
            return refused
        try:
            return log_download(run, escapes=request.query_params.get("ansi") == "1")
        except RayJobsError as error:
            return HttpResponse(f"logs unavailable: {error}", status=503, content_type="text/plain")

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
            found = artifacts.open_artifact(self.get_object().pk, path)
        except artifacts.ArtifactNotFound:
            raise Http404(f"run {pk} has no file {path!r}") from None
        return artifacts.download_response(found, path)

    @extend_schema(parameters=EPISODE_FILTERS, responses={200: EpisodePageSerializer})
    @action(detail=True, methods=["get"])
    def episodes(self, request: Request, pk: str) -> Response:
        """The run's recorded episode videos, newest first, filtered, a page at a time;
        each with its record (who acted and the reward at each step) and its video's
        URL (`thinned`: deleted to keep the run's video budget)."""
        run = self.get_object()
        filters, problems = filters_from_query(request.query_params)
        if problems:
            raise ValidationError({"detail": "; ".join(problems)})
        found = episodes_of(run, filters).order_by("-created_at", "-pk")
        page = EpisodePagination().paginate_queryset(found, request, view=self)
        kept = kept_names(run.pk)
        results = [
            {**shown(event, kept), "video_url": f"/api/v1/runs/{run.pk}/episodes/"
                                                f"{event.data.get('name')}.mp4"}
            for event in page
        ]  # fmt: skip
        return Response({"count": found.count(), "results": results})

    @extend_schema(responses={(200, "video/mp4"): bytes, (206, "video/mp4"): bytes})
    @action(detail=True, methods=["get"], url_path=r"episodes/(?P<name>[^/]+)\.mp4")
    def episode(self, request: Request, pk: str, name: str) -> HttpResponse:
        """One recorded episode's video (H.264 mp4); a `Range` header gets that part."""
        try:
            found = open_video(self.get_object(), name)
        except EpisodeNotFound:
            raise Http404(f"run {pk} has no episode video {name!r}") from None
        return video_response(request, found)

    @extend_schema(parameters=[EventsQuery])
    @action(detail=True, methods=["get"])
    def events(self, request: Request, pk: str) -> Response:
        """The run's events, oldest first, a page at a time: `next_after` is the cursor
        for the next page (null on the last)."""
        run = self.get_object()
        query = read_query(EventsQuery, request)
        return Response(run_events.events_page(run.pk, query["after"], query["limit"]))

    @extend_schema(parameters=[PointsQuery])
    @action(detail=True, methods=["get"], renderer_classes=SERIES_RENDERERS)
    def metrics(self, request: Request, pk: str) -> Response:
        """With `key`: its raw points by step, a page at a time (`next_after` is the
        cursor). Without: `{"latest": {key: {step, value, wall_time}}}`."""
        run = self.get_object()
        query = read_query(PointsQuery, request)
        if not query.get("key"):
            return Response({"latest": metric_series.latest(run.pk)["values"]})
        page = metric_series.points_page(run.pk, query["key"], query["after"], query["limit"])
        return Response(page)

    @extend_schema(parameters=[SeriesQuery])
    @action(detail=True, methods=["get"], renderer_classes=SERIES_RENDERERS)
    def series(self, request: Request, pk: str) -> Response:
        """Keys downsampled on the server into buckets with min/max/mean/last/count."""
        run = self.get_object()
        query = read_query(SeriesQuery, request)
        return Response(metric_series.series(
            run.pk, query["keys"], x=query["x"], steps=query["steps"], buckets=query["buckets"]
        ))  # fmt: skip

    @action(detail=True, methods=["get"], renderer_classes=SERIES_RENDERERS)
    def latest(self, request: Request, pk: str) -> Response:
        """Every key's value at its highest step."""
        return Response(metric_series.latest(self.get_object().pk))

    @extend_schema(parameters=[BucketsQuery])
    @action(detail=True, methods=["get"], renderer_classes=SERIES_RENDERERS)
    def success(self, request: Request, pk: str) -> Response:
        """Overall, per-horizon and per-task success from summed counts, and each
        task's latest iteration."""
        run = self.get_object()
        buckets = read_query(BucketsQuery, request)["buckets"]
        return Response(success_rates.success(run.pk, buckets))


def idempotency_key(request: Request) -> str | None:
    key = request.headers.get("Idempotency-Key") or None
    if key and len(key) > MAX_IDEMPOTENCY_KEY:
        raise ValidationError({"Idempotency-Key": f"At most {MAX_IDEMPOTENCY_KEY} characters."})
    return key
