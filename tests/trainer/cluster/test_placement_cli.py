"""`python -m trainer placement CLUSTER.yaml [--json]`, run as a user would."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = ROOT / "examples" / "clusters" / "heterogeneous_18_nodes.yaml"


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "trainer", "placement", *map(str, args)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_it_prints_a_table_of_the_plan():
    result = run_cli(EXAMPLE)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "component",
        "rank",
        "node",
        "local",
        "group",
        "resources",
        "node-local",
        "visible",
        "devices",
        "interpreter",
    ]
    assert lines[2].split() == [
        "actor",
        "0",
        "0",
        "0/8",
        "a800",
        "A800",
        "0",
        "0",
        "CUDA_VISIBLE_DEVICES=0",
        "/opt/venv/openpi/bin/python3",
    ]
    assert any(line.split()[:6] == ["env", "1", "17", "0/1", "franka", "Franka"] for line in lines)
    assert "processes per component: actor: 64, rollout: 64, env: 2, agent: 400" in result.stdout
    assert "nodes 0-7: GLOO_SOCKET_IFNAME=eth0" in result.stdout


def test_it_prints_json_with_the_flag():
    result = run_cli(EXAMPLE, "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["ok"] is True
    agent = data["plan"]["components"]["agent"]
    assert agent["world_size"] == 400
    assert agent["processes"][250] == {
        "component": "agent",
        "process_rank": 250,
        "node_rank": 2,
        "local_rank": 50,
        "local_world_size": 100,
        "node_group": "node",
        "resource_kind": "node",
        "hardware_type": None,
        "resource_ranks": [2],
        "local_hardware_ranks": [],
        "visible_accelerators": [0, 1, 2, 3, 4, 5, 6, 7],
        "env_vars": {"GLOO_SOCKET_IFNAME": "eth0", "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"},
        "python_interpreter_path": "/opt/venv/openpi/bin/python3",
    }


BROKEN = """cluster:
  num_nodes: 4
  component_placement:
    agent:
      node_group: node
      placement: 0-1:0-200,2-3:201-511
    actor: {node_group: gpus, placement: 0-3}
  node_groups:
    - label: cluster
      node_ranks: 0-3
"""


def test_it_prints_every_error_and_exits_2(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN)
    result = run_cli(path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "3 problems" in result.stderr
    assert "line 9: cluster.node_groups[0].label: node group label 'cluster' is reserved" in (
        result.stderr
    )
    assert "segment '0-1:0-200': 201 processes (0-200) on 2 resources" in result.stderr
    assert "segment '2-3:201-511': 311 processes" in result.stderr
    assert "Traceback" not in result.stderr


def test_it_prints_errors_as_json_with_the_flag(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text(BROKEN.replace("label: cluster", "label: gpus"))
    result = run_cli(path, "--json")
    assert result.returncode == 2
    data = json.loads(result.stdout)
    assert data["ok"] is False
    assert [(e["component"], e["segment"], e["rule"], e["line"]) for e in data["errors"]] == [
        ("agent", "0-1:0-200", "placement.whole_multiple", 6),
        ("agent", "2-3:201-511", "placement.whole_multiple", 6),
    ]


def test_a_missing_file_exits_2(tmp_path):
    result = run_cli(tmp_path / "nope.yaml")
    assert result.returncode == 2
    assert "cannot read" in result.stderr and "Traceback" not in result.stderr


def test_invalid_yaml_exits_2(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("cluster:\n  num_nodes: [1\n")
    result = run_cli(path)
    assert result.returncode == 2
    assert "invalid YAML" in result.stderr


def test_the_trainer_command_lists_its_subcommands():
    result = subprocess.run(
        [sys.executable, "-m", "trainer", "--help"], cwd=ROOT, capture_output=True, text=True
    )
    assert result.returncode == 0
    assert "placement" in result.stdout
