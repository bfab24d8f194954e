"""The cluster inventory, as rows: clusters, node groups, env configs, robots and nodes.

A cluster is written through `inventory.services` only (import a `cluster:` section, or
edit its YAML), which validates it with the trainer's own rules first; `Node` rows are
derived from the groups at each save so pages and the API can list nodes directly.
"""

from django.db import models


class Cluster(models.Model):
    name = models.SlugField(max_length=100, unique=True)
    description = models.TextField(blank=True)
    num_nodes = models.PositiveIntegerField()
    # As the user wrote it (strings kept as text), so an export gives it back unchanged.
    component_placement = models.JSONField(null=True, blank=True)
    # The cluster-level `accelerators:` entries (nodes outside a group's declaration).
    accelerator_declarations = models.JSONField(default=list, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class NodeGroup(models.Model):
    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="node_groups")
    position = models.PositiveIntegerField()
    label = models.CharField(max_length=100)
    node_ranks = models.CharField(max_length=2000, help_text="Ranks as text, e.g. 0-7,9.")
    accelerator_type = models.CharField(max_length=100, blank=True)
    accelerator_count = models.PositiveIntegerField(null=True, blank=True)
    accelerator_vendor = models.CharField(max_length=20, blank=True)
    hardware_type = models.CharField(max_length=100, blank=True)
    # RLinf's `ignore_hardware: true`: the group's resources are its nodes.
    ignore_hardware = models.BooleanField(default=False)

    class Meta:
        ordering = ["cluster", "position"]
        constraints = [
            models.UniqueConstraint(fields=["cluster", "label"], name="unique_group_label")
        ]

    def __str__(self) -> str:
        return f"{self.cluster.name}/{self.label}"


class EnvConfig(models.Model):
    node_group = models.ForeignKey(NodeGroup, on_delete=models.CASCADE, related_name="env_configs")
    position = models.PositiveIntegerField()
    node_ranks = models.CharField(max_length=2000)
    env_vars = models.JSONField(default=list, blank=True, help_text='[{"KEY": "value"}, …]')
    # None means "not given", which an export must tell apart from a value.
    python_interpreter_path = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001

    class Meta:
        ordering = ["node_group", "position"]

    def __str__(self) -> str:
        return f"{self.node_group} env {self.node_ranks}"


class Robot(models.Model):
    """One entry of a node group's `hardware.configs`. Its IP and camera serials are data:
    nothing in the control plane connects to them."""

    node_group = models.ForeignKey(NodeGroup, on_delete=models.CASCADE, related_name="robots")
    hardware_rank = models.PositiveIntegerField()
    node_rank = models.PositiveIntegerField()
    robot_ip = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001
    camera_serials = models.JSONField(null=True, blank=True)
    extra = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["node_group", "hardware_rank"]

    def __str__(self) -> str:
        return f"{self.node_group.cluster.name}/{self.name}"

    @property
    def type(self) -> str:
        return self.node_group.hardware_type

    @property
    def name(self) -> str:
        return f"{self.node_group.label}-{self.hardware_rank}"


class Node(models.Model):
    """A node with what it inherits from the groups (derived at each save)."""

    cluster = models.ForeignKey(Cluster, on_delete=models.CASCADE, related_name="nodes")
    rank = models.PositiveIntegerField()
    groups = models.JSONField(default=list)
    accelerator_type = models.CharField(max_length=100, blank=True)
    accelerator_count = models.PositiveIntegerField(default=0)
    env_vars = models.JSONField(default=dict, blank=True)
    # The node's one interpreter; None when its groups name none or different ones.
    python_interpreter_path = models.CharField(max_length=500, null=True, blank=True)  # noqa: DJ001
    # Group label -> interpreter: a process runs the one of the group it is placed through.
    python_interpreters = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["cluster", "rank"]
        constraints = [models.UniqueConstraint(fields=["cluster", "rank"], name="unique_node")]

    def __str__(self) -> str:
        return f"{self.cluster.name}/node {self.rank}"
