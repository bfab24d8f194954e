"""Clusters are stored as rows, validated by the trainer's rules, and export back
without loss."""

from pathlib import Path

import pytest
from django.conf import settings

from controlplane.experiments.services import create_experiment
from controlplane.inventory.models import Cluster, EnvConfig, Node, NodeGroup, Robot
from controlplane.inventory.services import (
    editable_cluster_yaml,
    export_cluster_yaml,
    import_cluster_yaml,
    to_trainer_cluster,
)
from controlplane.runs.launch import freeze_config
from trainer import cluster as tc
from trainer.config.errors import ConfigError

pytestmark = pytest.mark.django_db

EXAMPLES = sorted((Path(settings.BASE_DIR) / "examples" / "clusters").glob("*.yaml"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.stem)
def test_every_example_round_trips_through_the_database(path):
    text = path.read_text()
    cluster = import_cluster_yaml(path.stem.replace("_", "-"), text)
    assert to_trainer_cluster(cluster) == tc.load_cluster_yaml(text)
    assert tc.load_cluster_yaml(export_cluster_yaml(cluster)) == tc.load_cluster_yaml(text)


def test_the_seed_example_imports_with_its_groups_nodes_and_robots():
    text = (settings.BASE_DIR / "examples/clusters/heterogeneous_18_nodes.yaml").read_text()
    cluster = import_cluster_yaml("hetero", text, "the seed's example")
    assert cluster.num_nodes == 18
    assert [g.label for g in cluster.node_groups.all()] == ["a800", "4090", "franka"]
    assert Node.objects.filter(cluster=cluster).count() == 18
    a800 = cluster.node_groups.get(label="a800")
    assert (a800.accelerator_type, a800.accelerator_count) == ("A800", 8)
    robots = Robot.objects.filter(node_group__cluster=cluster)
    assert robots.count() == 2
    assert {r.robot_ip for r in robots} <= {f"192.0.2.{i}" for i in range(256)}
    assert tc.resolve_placement(to_trainer_cluster(cluster)).world_size("actor") > 0


def test_reimporting_replaces_the_rows():
    import_cluster_yaml(
        "c",
        "cluster:\n  num_nodes: 2\n  node_groups:\n    - label: a\n      node_ranks: 0-1\n",
    )
    cluster = import_cluster_yaml("c", "cluster:\n  num_nodes: 1\n")
    assert Cluster.objects.count() == 1
    assert cluster.node_groups.count() == 0
    assert cluster.nodes.count() == 1


def test_an_invalid_cluster_writes_nothing_and_names_every_problem():
    text = "cluster:\n  num_nodes: 2\n  node_groups:\n    - label: node\n      node_ranks: 0-3\n"
    with pytest.raises(tc.ClusterConfigError) as caught:
        import_cluster_yaml("bad", text)
    rules = {issue.rule for issue in caught.value.issues}
    assert len(rules) >= 2  # the reserved label and the ranks beyond num_nodes
    assert all(issue.line for issue in caught.value.issues)
    assert not Cluster.objects.filter(name="bad").exists()


def test_ignore_hardware_is_kept_through_the_database():
    text = """cluster:
  num_nodes: 2
  node_groups:
    - label: sim
      node_ranks: 0-1
      accelerators: {type: L4, count: 1}
      ignore_hardware: true
"""
    cluster = import_cluster_yaml("sims", text)
    assert cluster.node_groups.get(label="sim").ignore_hardware is True
    assert to_trainer_cluster(cluster).group("sim").ignore_hardware is True
    assert "ignore_hardware: true" in export_cluster_yaml(cluster)


def test_a_node_lists_the_interpreter_of_each_of_its_groups():
    text = (Path(settings.BASE_DIR) / "examples/clusters/simulators_and_robots.yaml").read_text()
    cluster = import_cluster_yaml("sims-and-robots", text)
    node = Node.objects.get(cluster=cluster, rank=2)
    assert node.python_interpreter_path is None  # two groups, two interpreters
    assert node.python_interpreters == {
        "sim": "/opt/venv/sim/bin/python3",
        "robot": "/opt/venv/franka/bin/python3",
    }
    single = Node.objects.get(cluster=cluster, rank=1)
    assert single.python_interpreter_path == "/opt/venv/sim/bin/python3"


def test_rows_edited_into_an_invalid_cluster_name_their_problems_instead_of_failing():
    text = (Path(settings.BASE_DIR) / "examples/clusters/two_nodes.yaml").read_text()
    cluster = import_cluster_yaml("lab", text)
    # Rows can be changed outside save_cluster (the admin's shell, the database).
    NodeGroup.objects.filter(cluster=cluster, label="gpu").update(
        node_ranks="0-9", accelerator_count=None
    )
    EnvConfig.objects.filter(node_group__label="robot").update(env_vars={"A": "1"})
    Robot.objects.filter(node_group__cluster=cluster).update(extra=["not", "a", "mapping"])
    with pytest.raises(tc.ClusterConfigError) as caught:
        to_trainer_cluster(cluster)
    found = {(issue.rule, issue.location) for issue in caught.value.issues}
    assert found == {
        ("node_ranks.out_of_range", "cluster.node_groups[0].node_ranks"),
        ("accelerators.count", "cluster.node_groups[0].accelerators.count"),
        ("env_var.format", "cluster.node_groups[1].env_configs[0].env_vars"),
        ("storage.invalid", "cluster.node_groups[1].hardware.configs[0]"),
    }
    text, problems = editable_cluster_yaml(cluster)  # what an editor starts from
    assert "0-9" in text and {issue.rule for issue in problems} >= {"node_ranks.out_of_range"}


def test_a_launch_on_an_invalid_stored_cluster_is_a_config_error():
    cluster = import_cluster_yaml("c", "cluster:\n  num_nodes: 2\n")
    Cluster.objects.filter(pk=cluster.pk).update(accelerator_declarations=[{"count": 1}])
    experiment = create_experiment("reach", "runner:\n  iterations: 1\n")
    with pytest.raises(ConfigError) as caught:
        freeze_config(experiment.latest_revision, [], Cluster.objects.get(pk=cluster.pk))
    assert {(problem.rule, problem.location) for problem in caught.value.problems} == {
        ("accelerators.type", "cluster.accelerators[0].type"),
        ("accelerators.format", "cluster.accelerators[0].node_ranks"),
    }
