from rest_framework import serializers

from controlplane.experiments.models import Experiment, Revision
from controlplane.inventory.models import Cluster, EnvConfig, Node, NodeGroup, Robot
from controlplane.runs.models import Run


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
            "accelerator_vendor", "hardware_type", "env_configs", "robots",
        ]  # fmt: skip


class NodeSerializer(serializers.ModelSerializer):
    class Meta:
        model = Node
        fields = [
            "rank", "groups", "accelerator_type", "accelerator_count",
            "env_vars", "python_interpreter_path",
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

    class Meta:
        model = Run
        fields = [
            "id", "experiment", "revision", "cluster", "overrides", "state", "exit_reason",
            "progress_step", "progress_total", "summary", "ray_job_id", "attempt",
            "cancel_requested_at", "timeout_s",
            "created_by", "created_at", "submitted_at", "started_at", "finished_at",
        ]  # fmt: skip


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
