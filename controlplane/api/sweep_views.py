"""REST endpoints of sweeps: make one (its space checked against the trainer's schema:
400 with every problem at its key path), read it with its trials best first and the
parameters' importances, cancel it, and turn its best trial into a revision."""

import yaml
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.request import Request
from rest_framework.response import Response

from controlplane.api.experiment_views import config_problems
from controlplane.api.run_views import idempotency_key
from controlplane.api.serializers import RevisionSerializer
from controlplane.experiments.models import Experiment
from controlplane.inventory.models import Cluster
from controlplane.sweeps import services
from controlplane.sweeps.models import Sweep
from trainer.config.errors import ConfigError


class SweepSerializer(serializers.ModelSerializer):
    experiment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    revision = serializers.IntegerField(source="revision.number", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.StringRelatedField()
    best = serializers.SerializerMethodField(
        help_text="The complete trial with the best objective: number, value, params, run."
    )
    trials = serializers.SerializerMethodField(
        help_text="Every trial, best objective first: number, state, params, value (final, "
        "or the latest reported), step, reason, run."
    )
    importances = serializers.SerializerMethodField(
        help_text="Each parameter's importance to the objective (Optuna's fANOVA); empty "
        "until two trials have completed."
    )

    class Meta:
        model = Sweep
        fields = [
            "id", "experiment", "revision", "cluster", "state", "reason", "spec", "spec_yaml",
            "best", "trials", "importances", "cancel_requested_at", "created_by",
            "created_at", "finished_at",
        ]  # fmt: skip

    def get_best(self, sweep: Sweep) -> dict | None:
        best = services.best_trial(sweep)
        if best is None:
            return None
        return {"number": best.number, "value": best.value, "params": best.params,
                "run": best.run_id}  # fmt: skip

    def get_trials(self, sweep: Sweep) -> list[dict]:
        return services.trial_rows(sweep)

    def get_importances(self, sweep: Sweep) -> dict[str, float]:
        return services.importances(sweep) if self.context.get("importances") else {}


class SweepCreateSerializer(serializers.Serializer):
    """The sweep as YAML text (`spec`), or its parts as JSON; either is checked as a whole
    against the trainer's schema by the sweeps service."""

    experiment = serializers.SlugField()
    revision = serializers.IntegerField(required=False, min_value=1)
    cluster = serializers.SlugField(required=False)
    spec = serializers.CharField(
        required=False, max_length=100_000,
        help_text="The sweep as YAML: the parts below in one text (what the page's form and "
        "the CI client send).",
    )  # fmt: skip
    space = serializers.JSONField(
        required=False, help_text="Key path → {loguniform | uniform | int: [low, high]} or "
        "{choice: [values]}.",
    )  # fmt: skip
    objective = serializers.JSONField(
        required=False, help_text="{metric, direction: max | min, last: points averaged}."
    )
    budget = serializers.JSONField(required=False, help_text="{trials, parallel, wall_time_min}.")
    sampler = serializers.CharField(required=False, help_text="tpe (default), random or grid.")
    pruner = serializers.CharField(required=False, help_text="median (default), halving or none.")

    PARTS = ("space", "objective", "budget", "sampler", "pruner")

    def validate(self, data: dict) -> dict:
        parts = {key: data[key] for key in self.PARTS if key in data}
        if ("spec" in data) == bool(parts):
            raise serializers.ValidationError(
                "Give the sweep either as `spec` (YAML text) or as space, objective, budget "
                "(and optionally sampler, pruner), not both."
            )
        if parts:  # one text either way: what the sweep's page shows as written
            data["spec"] = yaml.safe_dump(parts, sort_keys=False)
        return data


class SweepViewSet(mixins.ListModelMixin, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    queryset = Sweep.objects.select_related("experiment", "revision", "cluster", "created_by")
    serializer_class = SweepSerializer

    def get_serializer_context(self) -> dict:
        # Importances fit a model over the trials: on one sweep's read, not on lists.
        return {**super().get_serializer_context(), "importances": self.action == "retrieve"}

    @extend_schema(
        request=SweepCreateSerializer,
        responses={201: SweepSerializer, 200: SweepSerializer, 400: None},
        parameters=[OpenApiParameter("Idempotency-Key", str, OpenApiParameter.HEADER)],
    )
    def create(self, request: Request) -> Response:
        body = SweepCreateSerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        experiment = get_object_or_404(Experiment, name=data["experiment"])
        revision = None
        if "revision" in data:
            revision = get_object_or_404(experiment.revisions, number=data["revision"])
        cluster = get_object_or_404(Cluster, name=data["cluster"]) if "cluster" in data else None
        try:
            sweep, created = services.create_sweep(
                experiment, data["spec"], user=request.user, revision=revision,
                cluster=cluster, idempotency_key=idempotency_key(request),
            )  # fmt: skip
        except ConfigError as error:
            return config_problems(error, data["spec"])
        return Response(
            self.get_serializer(sweep).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )

    @extend_schema(request=None, responses={202: SweepSerializer})
    @action(detail=True, methods=["post"])
    def cancel(self, request: Request, pk: str) -> Response:
        """Stop the sweep: its running trials' runs are cancelled (each checkpoints), and
        the sweep ends once they have."""
        sweep = services.cancel_sweep(self.get_object())
        return Response(self.get_serializer(sweep).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={201: RevisionSerializer, 400: None})
    @action(detail=True, methods=["post"], url_path="best-revision")
    def best_revision(self, request: Request, pk: str) -> Response:
        """A new revision of the sweep's experiment with the best trial's values written
        in (200 with the latest revision when it already says the same)."""
        sweep = self.get_object()
        latest = sweep.experiment.latest_revision
        try:
            revision = services.revision_from_best(sweep, request.user)
        except ConfigError as error:
            return config_problems(error)
        unchanged = latest is not None and revision.pk == latest.pk
        return Response(
            RevisionSerializer(revision).data,
            status=status.HTTP_200_OK if unchanged else status.HTTP_201_CREATED,
        )
