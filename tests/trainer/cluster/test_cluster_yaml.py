"""YAML import/export of the `cluster:` section: lossless round trip, line numbers in errors,
and the YAML 1.1 base-60 pitfall (`1:2` read as 62)."""

from pathlib import Path

import pytest
import yaml as pyyaml

from trainer.cluster import (
    ClusterConfigError,
    cluster_from_dict,
    cluster_to_dict,
    dump_cluster_yaml,
    load_cluster_yaml,
    load_placement_yaml,
    resolve_placement,
    resolve_placement_text,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "clusters"
SEED_EXAMPLE = (EXAMPLES / "heterogeneous_18_nodes.yaml").read_text()


@pytest.mark.parametrize("name", ["heterogeneous_18_nodes.yaml", "two_nodes.yaml"])
def test_export_then_import_gives_the_same_cluster(name):
    cluster = load_cluster_yaml((EXAMPLES / name).read_text())
    text = dump_cluster_yaml(cluster)
    again = load_cluster_yaml(text)
    assert again == cluster
    assert dump_cluster_yaml(again) == text  # the export is a fixed point
    assert cluster_from_dict(cluster_to_dict(cluster)) == cluster


def test_the_seed_example_exports_in_the_seed_layout():
    section = cluster_to_dict(load_cluster_yaml(SEED_EXAMPLE))
    assert section == {
        "num_nodes": 18,
        "component_placement": {
            "actor": {"node_group": "a800", "placement": "0-63"},
            "rollout": {"node_group": "4090", "placement": "0-63"},
            "env": {"node_group": "franka", "placement": "0-1"},
            "agent": {"node_group": "node", "placement": "0-1:0-199,2-3:200-399"},
        },
        "node_groups": [
            {
                "label": "a800",
                "node_ranks": "0-7",
                "accelerators": {"type": "A800", "count": 8},
                "env_configs": [
                    {
                        "node_ranks": "0-7",
                        "python_interpreter_path": "/opt/venv/openpi/bin/python3",
                        "env_vars": [{"GLOO_SOCKET_IFNAME": "eth0"}],
                    }
                ],
            },
            {
                "label": "4090",
                "node_ranks": "8-15",
                "accelerators": {"type": "RTX4090", "count": 8},
                "env_configs": [
                    {"node_ranks": "8-15", "env_vars": [{"GLOO_SOCKET_IFNAME": "eth1"}]}
                ],
            },
            {
                "label": "franka",
                "node_ranks": "16-17",
                "hardware": {
                    "type": "Franka",
                    "configs": [
                        {
                            "robot_ip": "192.0.2.1",
                            "node_rank": 16,
                            "camera_serials": ["322142001230", "322142001231"],
                        },
                        {
                            "robot_ip": "192.0.2.2",
                            "node_rank": 17,
                            "camera_serials": ["322142001232", "322142001233"],
                        },
                    ],
                },
            },
        ],
    }


def test_the_round_trip_keeps_extras_vendors_and_cluster_level_accelerators():
    text = """
cluster:
  num_nodes: 3
  accelerators:
    - {node_ranks: 2, type: MI300X, count: 8, vendor: amd}
  component_placement:
    actor,critic: 0-7
    gpu_workers: {node_group: ["a", "b"], placement: "0-15:0-7"}
  node_groups:
    - label: a
      node_ranks: [0]
      accelerators: {type: H100, count: 8}
      env_configs:
        - node_ranks: 0
          env_vars: [{OMP_NUM_THREADS: 4}, {NCCL_DEBUG: "1:2"}]
    - label: b
      node_ranks: 1
      accelerators: {type: H100, count: 8}
      hardware:
        type: Franka
        configs:
          - {robot_ip: "2001:db8::1", node_rank: 1, gripper: {kind: robotiq, stroke_mm: 85}}
"""
    cluster = load_cluster_yaml(text)
    assert load_cluster_yaml(dump_cluster_yaml(cluster)) == cluster
    assert cluster.node(2).visibility_env_var == "HIP_VISIBLE_DEVICES"
    assert cluster.node(0).env_vars == {"OMP_NUM_THREADS": "4", "NCCL_DEBUG": "1:2"}
    assert cluster.node_groups[1].hardware.configs[0].extra == {
        "gripper": {"kind": "robotiq", "stroke_mm": 85}
    }


def test_a_base_60_looking_placement_stays_the_text_written():
    text = """
cluster:
  num_nodes: 1
  node_groups:
    - {label: gpu, node_ranks: 0, accelerators: {type: A800, count: 8}}
  component_placement:
    actor: {node_group: gpu, placement: 1:2}
    critic: 2:30
"""
    # A YAML 1.1 loader reads these as sexagesimal integers: 1*60+2 and 2*60+30.
    naive = pyyaml.safe_load(text)["cluster"]["component_placement"]
    assert (naive["actor"]["placement"], naive["critic"]) == (62, 150)
    cluster = load_cluster_yaml(text)
    assert cluster.component_placement["actor"]["placement"] == "1:2"
    assert cluster.component_placement["critic"] == "2:30"
    # Read as written, `1:2` puts process 2 on GPU 1, so processes 0-1 are missing; it never
    # silently becomes GPU 62.
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(cluster)
    messages = [str(i) for i in caught.value.issues]
    assert any("process ranks 0-1 are missing" in m for m in messages)
    assert not any("62" in m for m in messages)
    # The export quotes placements, so even a YAML 1.1 reader gets the text back.
    exported = pyyaml.safe_load(dump_cluster_yaml(cluster))["cluster"]["component_placement"]
    assert exported["actor"]["placement"] == "1:2"
    assert exported["critic"] == "2:30"


def test_errors_point_at_their_yaml_line():
    text = """cluster:
  num_nodes: 2
  node_groups:
    - label: gpu
      node_ranks: 0-5
  component_placement:
    actor: 0-1:0-2
"""
    with pytest.raises(ClusterConfigError) as caught:
        load_cluster_yaml(text)
    ranks, placement = caught.value.issues
    assert (ranks.rule, ranks.line) == ("node_ranks.out_of_range", 5)
    assert str(ranks).startswith("line 5: cluster.node_groups[0].node_ranks:")
    # The placement's arithmetic is checked even though the inventory is broken.
    assert (placement.rule, placement.line) == ("placement.whole_multiple", 7)


def test_resolution_errors_point_at_the_placement_line():
    text = "cluster:\n  num_nodes: 2\n  component_placement:\n    actor: 0\n    agent: 0-1:0-2\n"
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(load_cluster_yaml(text))
    (issue,) = caught.value.issues
    assert (issue.rule, issue.line, issue.segment) == ("placement.whole_multiple", 5, "0-1:0-2")


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("cluster: [", "yaml.syntax"),
        ("cluster:\n  num_nodes: 1\n  num_nodes: 2\n", "yaml.syntax"),  # duplicate key
        ("just text", "yaml.no_cluster"),
        ("", "yaml.no_cluster"),
        ("cluster: 5", "cluster.type"),
        ("cluster:\n  node_groups: []\n", "cluster.num_nodes"),
    ],
)
def test_malformed_yaml_is_a_validation_error(text, rule):
    with pytest.raises(ClusterConfigError) as caught:
        load_cluster_yaml(text)
    assert caught.value.issues[0].rule == rule


def test_syntax_errors_carry_their_line():
    with pytest.raises(ClusterConfigError) as caught:
        load_cluster_yaml("cluster:\n  num_nodes: 1\n  node_groups: [\n")
    assert caught.value.issues[0].line == 4


def test_a_bare_section_loads_too():
    cluster = load_cluster_yaml("num_nodes: 2\ncomponent_placement: {actor: 0-1}\n")
    assert cluster.num_nodes == 2


@pytest.mark.parametrize(
    "text",
    [
        "actor: 0-1:0-2\n",
        "component_placement:\n  actor: 0-1:0-2\n",
        "cluster:\n  component_placement:\n    actor: 0-1:0-2\n",
    ],
)
def test_a_placement_given_as_yaml_text_resolves_with_lines(text):
    raw, lines = load_placement_yaml(text)
    assert raw == {"actor": "0-1:0-2"}
    cluster = cluster_from_dict({"num_nodes": 2})
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement_text(cluster, text)
    (issue,) = caught.value.issues
    assert issue.location == "cluster.component_placement.actor"
    assert issue.line == text.count("\n")  # the `actor:` line is the last one
    assert lines[("cluster", "component_placement", "actor")] == issue.line


def test_a_placement_passed_separately_gets_no_lines_from_the_cluster_file():
    cluster = load_cluster_yaml(SEED_EXAMPLE)
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(cluster, {"actor": {"node_group": "a800", "placement": "0-64"}})
    (issue,) = caught.value.issues
    assert issue.line is None
    assert issue.message.startswith("component 'actor', segment '0-64': resource rank 64")
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement_text(cluster, "\n\nactor: {node_group: a800, placement: 0-64}\n")
    assert caught.value.issues[0].line == 3


def test_an_unquoted_comma_in_a_flow_mapping_gets_a_hint():
    text = "cluster:\n  num_nodes: 4\n  component_placement:\n"
    text += "    agent: {node_group: node, placement: 0-1:0-1,2-3:2-3}\n"
    with pytest.raises(ClusterConfigError) as caught:
        load_cluster_yaml(text)
    (issue,) = caught.value.issues
    assert issue.rule == "placement.unknown_key"
    assert "quote a placement that contains commas" in issue.message
    quoted = text.replace("0-1:0-1,2-3:2-3", '"0-1:0-1,2-3:2-3"')
    assert resolve_placement(load_cluster_yaml(quoted)).world_size("agent") == 4
