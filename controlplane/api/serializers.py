from django.utils import timezone
from rest_framework import serializers

from controlplane.experiments.models import Experiment, Revision
from controlplane.inventory.models import Cluster, EnvConfig, Node, NodeGroup, Robot
from controlplane.runs.models import Run
from controlplane.runs.selectors import with_figures


class EnvConfigSerializer(serializers.ModelSerializer):
    class Meta:
        model = EnvConfig
        fields = ["node_ranks", "env_vars", "python_interpreter_path"]


class RobotSerializer(serializers.ModelSerializer):
    cluster = serializers.CharField(source="node_group.cluster.name", read_only=True)
    node_group = serializers.CharField(source="node_group.label", read_only=True)

    class Meta:
        model = Robot
        fields = [
            "name", "type", "cluster", "node_group", "hardware_rank", "node_rank",
            "robot_ip", "camera_serials", "extra",
        ]  # fmt: skip


class NodeGroupSerializer(serializers.ModelSerializer):
    env_configs = EnvConfigSerializer(many=True, read_only=True)
    robots = RobotSerializer(many=True, read_only=True)

    class Meta:
        model = NodeGroup
        fields = [
            "label", "node_ranks", "accelerator_type", "accelerator_count",
            "accelerator_vendor", "hardware_type", "ignore_hardware", "env_configs", "robots",
        ]  # fmt: skip


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = [
            "rank", "groups", "accelerator_type", "accelerator_count",
            "env_vars", "python_interpreter_path", "python_interpreters",
        ]  # fmt: skip


class ClusterSerializer(serializers.ModelSerializer):
    node_groups = NodeGroupSerializer(many=True, read_only=True)

    class Meta:
        model = Cluster
        fields = [
            "name", "description", "num_nodes", "component_placement",
            "accelerator_declarations", "node_groups", "created_at", "updated_at",
        ]  # fmt: skip


class ClusterWriteSerializer(serializers.Serializer):
    """A cluster is written as its `cluster:` section: YAML text or the same as JSON."""

    name = serializers.SlugField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    yaml = serializers.CharField(required=False, help_text="YAML with a cluster: section.")
    config = serializers.DictField(required=False, help_text="The cluster: section as JSON.")

    def validate(self, data: dict) -> dict:
        if ("yaml" in data) == ("config" in data):
            raise serializers.ValidationError("Give exactly one of 'yaml' or 'config'.")
        return data


class PlacementPreviewSerializer(serializers.Serializer):
    cluster = serializers.SlugField(required=False, help_text="Name of a stored cluster.")
    cluster_yaml = serializers.CharField(required=False, help_text="Or a cluster: section.")
    placement = serializers.JSONField(
        required=False,
        help_text="component_placement as YAML text or an object; omitted: the cluster's own.",
    )

    def validate(self, data: dict) -> dict:
        if ("cluster" in data) == ("cluster_yaml" in data):
            raise serializers.ValidationError("Give exactly one of 'cluster' or 'cluster_yaml'.")
        placement = data.get("placement")
        if placement is not None and not isinstance(placement, str | dict):
            raise serializers.ValidationError(
                {"placement": "Must be YAML text or an object mapping components to rules."}
            )
        return data


class RevisionSerializer(serializers.ModelSerializer):
    author = serializers.StringRelatedField()

    class Meta:
        model = Revision
        fields = ["number", "config_yaml", "message", "author", "created_at"]


class ExperimentSerializer(serializers.ModelSerializer):
    created_by = serializers.StringRelatedField()
    latest_revision = RevisionSerializer(read_only=True)

    class Meta:
        model = Experiment
        fields = [
            "name", "description", "tags", "created_by", "created_at", "updated_at",
            "latest_revision",
        ]  # fmt: skip


class ExperimentWriteSerializer(serializers.Serializer):
    name = serializers.SlugField(max_length=100)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    tags = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, default=list
    )
    config_yaml = serializers.CharField()


class RevisionWriteSerializer(serializers.Serializer):
    config_yaml = serializers.CharField()
    message = serializers.CharField(required=False, allow_blank=True, default="", max_length=300)


class RunSerializer(serializers.ModelSerializer):
    experiment = serializers.SlugRelatedField(slug_field="name", read_only=True)
    revision = serializers.IntegerField(source="revision.number", read_only=True)
    cluster = serializers.SlugRelatedField(slug_field="name", read_only=True)
    created_by = serializers.StringRelatedField()
    latest_success = serializers.SerializerMethodField(
        help_text="The run's success as every page shows it: the last iteration's "
        "rollout/success_rate (an eval run's suite average); null before the first."
    )
    duration_s = serializers.SerializerMethodField(
        help_text="Seconds from start to finish, or to now while running."
    )
    source_run = serializers.PrimaryKeyRelatedField(
        read_only=True, help_text="An eval run's source: the run whose checkpoint it evaluates."
    )
    source_iteration = serializers.IntegerField(
        read_only=True, help_text="An eval run's checkpoint: the source run's iteration."
    )
    eval_options = serializers.JSONField(
        read_only=True, help_text='An eval run\'s {"suite", "tasks", "states"} (null: defaults).'
    )

    class Meta:
        model = Run
        fields = [
            "id", "kind", "source_run", "source_iteration", "eval_options",
            "experiment", "revision", "cluster", "tags", "overrides", "state",
            "exit_reason", "latest_success", "duration_s",
            "progress_step", "progress_total", "summary", "ray_job_id", "attempt",
            "cancel_requested_at", "timeout_s",
            "created_by", "created_at", "submitted_at", "started_at", "finished_at",
        ]  # fmt: skip

    # Annotated by runs.selectors.with_figures on lists (one query for the page); a single
    # run read without the annotations is still answered.
    def get_latest_success(self, run: Run) -> float | None:
        """Run.shown_success: what every page shows as the run's success."""
        if not hasattr(run, "latest_success"):
            run = with_figures(Run.objects.filter(pk=run.pk)).get()
        return run.shown_success

    def get_duration_s(self, run: Run) -> float | None:
        if hasattr(run, "duration"):
            return run.duration.total_seconds() if run.duration is not None else None
        if run.started_at is None:
            return None
        return ((run.finished_at or timezone.now()) - run.started_at).total_seconds()


class ArtifactSerializer(serializers.Serializer):
    path = serializers.CharField(help_text="Relative to the run's folder.")
    size = serializers.IntegerField(help_text="Bytes.")
    modified = serializers.DateTimeField()


class RunCreateSerializer(serializers.Serializer):
    experiment = serializers.SlugField()
    revision = serializers.IntegerField(required=False, min_value=1)
    cluster = serializers.SlugField(required=False)
    overrides = serializers.ListField(
        child=serializers.RegexField(r"^[A-Za-z_][\w.\[\]]*=", max_length=1000),
        required=False,
        default=list,
    )
    timeout_s = serializers.IntegerField(required=False, min_value=1)
    tags = serializers.ListField(
        child=serializers.CharField(max_length=50), required=False, default=list,
        help_text="Added to the experiment's tags.",
    )  # fmt: skip


class EvaluateSerializer(serializers.Serializer):
    """What `POST /api/v1/runs/<id>/evaluate` takes; each is optional."""

    checkpoint = serializers.IntegerField(
        required=False, min_value=0, help_text="The iteration of the checkpoint (default: latest)."
    )
    suite = serializers.CharField(
        required=False, max_length=100, help_text="LIBERO suite (default: the run's)."
    )
    tasks = serializers.ListField(
        child=serializers.IntegerField(), required=False, max_length=1000,
        help_text="Task ids (default: the run's tasks).",
    )  # fmt: skip
    states = serializers.IntegerField(
        required=False, help_text="Init states per task, at least 1 (default: all)."
    )
    timeout_s = serializers.IntegerField(required=False, min_value=1)


class EvaluationSerializer(serializers.Serializer):
    """One evaluation of a run (an eval run), as `GET /api/v1/runs/<id>/evaluations`
    lists it."""

    id = serializers.IntegerField(help_text="The eval run.")
    state = serializers.CharField()
    checkpoint = serializers.IntegerField(help_text="The evaluated checkpoint's iteration.")
    env = serializers.CharField()
    suite = serializers.CharField(allow_null=True)
    tasks = serializers.ListField(child=serializers.IntegerField(), allow_null=True)
    states = serializers.IntegerField(allow_null=True)
    average = serializers.FloatField(allow_null=True, help_text="The suite average.")
    horizon_average = serializers.DictField(child=serializers.FloatField())
    created_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)


class EvaluationListSerializer(serializers.Serializer):
    results = EvaluationSerializer(many=True)


class EvalTableSerializer(serializers.Serializer):
    """An eval run and its per-task table (null until the trainer reports it)."""

    run = serializers.IntegerField()
    source_run = serializers.IntegerField(allow_null=True)
    checkpoint = serializers.IntegerField()
    state = serializers.CharField()
    options = serializers.JSONField()
    table = serializers.JSONField(
        allow_null=True,
        help_text='{"env", "suite", "checkpoint", "iteration", "horizons", "average", '
        '"horizon_average": {H: rate}, "tasks": [{"task_id", "name", "episodes", '
        '"successes", "rate", "per_horizon": {H: {"successes", "episodes", "rate"}}}]}',
    )


class EpisodeSerializer(serializers.Serializer):
    """A recorded episode (trainer.videos), as its `episode` event says it."""

    name = serializers.CharField()
    file = serializers.CharField()
    run = serializers.IntegerField()
    task = serializers.IntegerField()
    task_name = serializers.CharField(required=False)
    success = serializers.BooleanField()
    length = serializers.IntegerField()
    actors = serializers.ListField(child=serializers.ChoiceField(["policy", "human", "held"]))
    rewards = serializers.ListField(child=serializers.FloatField())
    human_steps = serializers.IntegerField()
    bytes = serializers.IntegerField()
    iteration = serializers.IntegerField(required=False, allow_null=True)
    init_state = serializers.IntegerField(required=False, allow_null=True)
    horizon = serializers.IntegerField(required=False, allow_null=True)
    thinned = serializers.BooleanField()
    video_url = serializers.CharField()


class EpisodePageSerializer(serializers.Serializer):
    count = serializers.IntegerField()
    results = EpisodeSerializer(many=True)
