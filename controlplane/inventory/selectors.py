"""Reads of the inventory for pages and the API."""

import io

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404
from ruamel.yaml import YAML
from ruamel.yaml.scalarstring import DoubleQuotedScalarString

from controlplane.inventory.models import Cluster, Robot
from controlplane.inventory.services import to_trainer_cluster
from trainer.cluster import ClusterConfigError
from trainer.config.inventory_arms import DeclaredArm, declared_arms


def get_cluster(name: str) -> Cluster:
    return get_object_or_404(Cluster, name=name)


def robots() -> QuerySet[Robot]:
    return Robot.objects.select_related("node_group__cluster").order_by(
        "node_group__cluster__name", "node_group__position", "hardware_rank"
    )


def inventory_arms(cluster: Cluster | None = None) -> list[DeclaredArm]:
    """The arms `cluster` declares, or with none, every cluster of the inventory. A
    cluster whose rows no longer form a valid cluster declares nothing: it cannot be
    launched with, and its arms are not vouched for until an admin mends it."""
    arms = []
    for row in [cluster] if cluster is not None else Cluster.objects.all():
        try:
            spec = to_trainer_cluster(row)
        except ClusterConfigError:
            continue
        declared, _ = declared_arms(spec, name=f"cluster {row.name}")
        arms += declared
    return arms


def placement_yaml(placement: dict | None) -> str:
    """The component_placement mapping as YAML, placement strings quoted so that no YAML
    1.1 reader can turn `1:2` into a base-60 number."""
    if not placement:
        return ""

    def quoted(value):
        if isinstance(value, dict):
            return {key: quoted(item) for key, item in value.items()}
        return DoubleQuotedScalarString(value) if isinstance(value, str) else value

    stream = io.StringIO()
    yaml = YAML()
    yaml.default_flow_style = False
    yaml.dump(quoted(placement), stream)
    return stream.getvalue()
