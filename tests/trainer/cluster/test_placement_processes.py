"""What a placed process gets where the plan meets real processes, as RLinf configs expect:
which accelerators it sees, which group's env vars and interpreter it runs with."""

import pytest

from trainer.cluster import (
    ClusterConfigError,
    cluster_from_dict,
    cluster_to_dict,
    dump_cluster_yaml,
    load_cluster_yaml,
    resolve_placement,
)


def mixed_cluster() -> dict:
    """Node 0: 4 GPUs in group `gpu`; node 1: 2 GPUs and a robot in group `robot`."""
    return {
        "num_nodes": 2,
        "node_groups": [
            {"label": "gpu", "node_ranks": 0, "accelerators": {"type": "A100", "count": 4}},
            {
                "label": "robot",
                "node_ranks": 1,
                "accelerators": {"type": "L4", "count": 2},
                "hardware": {"type": "Franka", "configs": [{"node_rank": 1}]},
            },
        ],
    }


def visibility(plan, component):
    return [
        (p.visible_accelerators, p.env_vars.get("CUDA_VISIBLE_DEVICES"))
        for p in plan.components[component]
    ]


def test_processes_not_placed_on_accelerators_see_every_accelerator_of_their_node():
    plan = resolve_placement(
        cluster_from_dict(mixed_cluster()),
        {
            "actor": {"node_group": "gpu", "placement": "1-2"},
            "agent": {"node_group": "node", "placement": "0-1"},
            "env": {"node_group": "robot", "placement": "0"},
        },
    )
    # Accelerator-placed: only its own devices.
    assert visibility(plan, "actor") == [((1,), "1"), ((2,), "2")]
    # Per node (reserved `node`) and on a robot: every accelerator of the node.
    assert visibility(plan, "agent") == [((0, 1, 2, 3), "0,1,2,3"), ((0, 1), "0,1")]
    assert visibility(plan, "env") == [((0, 1), "0,1")]


def test_on_a_node_without_declared_accelerators_nothing_is_hidden():
    # The group's resources are its nodes; the inventory knows of no accelerator there, so
    # the visibility variable is not set at all rather than set to hide everything.
    section = {"num_nodes": 2, "node_groups": [{"label": "cpu", "node_ranks": "0-1"}]}
    plan = resolve_placement(
        cluster_from_dict(section), {"sim": {"node_group": "cpu", "placement": "0-1"}}
    )
    assert {p.resource_kind for p in plan.processes} == {"node"}
    assert visibility(plan, "sim") == [((), None), ((), None)]


def test_a_component_may_ask_to_hide_the_accelerators():
    plan = resolve_placement(
        cluster_from_dict(mixed_cluster()),
        {
            "agent": {"node_group": "node", "placement": "0-1", "hide_accelerators": True},
            "env": {"node_group": "robot", "placement": "0", "hide_accelerators": True},
            "actor": {"node_group": "gpu", "placement": "3", "hide_accelerators": True},
            "sim": {"node_group": "node", "placement": "1", "hide_accelerators": False},
        },
    )
    assert visibility(plan, "agent") == [((), ""), ((), "")]
    assert visibility(plan, "env") == [((), "")]
    assert visibility(plan, "actor") == [((3,), "3")]  # its own devices, as always
    assert visibility(plan, "sim") == [((0, 1), "0,1")]


@pytest.mark.parametrize("value", ["yes", 1, None])
def test_hide_accelerators_must_be_a_boolean(value):
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(
            cluster_from_dict(mixed_cluster()),
            {"agent": {"node_group": "node", "placement": "0", "hide_accelerators": value}},
        )
    (issue,) = caught.value.issues
    assert issue.rule == "placement.hide_accelerators"
    assert issue.location == "cluster.component_placement.agent.hide_accelerators"


def test_the_cli_table_says_what_each_process_sees():
    from trainer.cluster.cli import format_plan

    section = mixed_cluster() | {"num_nodes": 3}
    section["node_groups"] = [*section["node_groups"], {"label": "cpu", "node_ranks": 2}]
    plan = resolve_placement(
        cluster_from_dict(section),
        {
            "actor": {"node_group": "gpu", "placement": "1"},
            "agent": {"node_group": "node", "placement": "0-2"},
            "quiet": {"node_group": "node", "placement": "0", "hide_accelerators": True},
        },
    )
    table = {tuple(line.split()[:2]): line for line in format_plan(plan).splitlines()}
    assert "CUDA_VISIBLE_DEVICES=1 " in table[("actor", "0")] + " "
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3 (all)" in table[("agent", "0")]
    assert "CUDA_VISIBLE_DEVICES=0,1 (all)" in table[("agent", "1")]
    assert "(node's own)" in table[("agent", "2")]
    assert 'CUDA_VISIBLE_DEVICES="" (none)' in table[("quiet", "0")]


def shared_node_cluster() -> dict:
    """Node 0 is in `sim` and in `learner`, each with its own environment."""
    return {
        "num_nodes": 2,
        "node_groups": [
            {
                "label": "learner",
                "node_ranks": "0-1",
                "accelerators": {"type": "A100", "count": 2},
                "env_configs": [
                    {
                        "node_ranks": "0-1",
                        "python_interpreter_path": "/opt/learner/bin/python",
                        "env_vars": [{"NCCL_SOCKET_IFNAME": "ib0"}],
                    }
                ],
            },
            {
                "label": "sim",
                "node_ranks": "0",
                "env_configs": [
                    {
                        "node_ranks": "0",
                        "python_interpreter_path": "/opt/sim/bin/python",
                        "env_vars": [{"MUJOCO_GL": "egl"}],
                    }
                ],
            },
        ],
    }


def test_a_process_gets_the_env_and_interpreter_of_the_group_it_is_placed_through():
    plan = resolve_placement(
        cluster_from_dict(shared_node_cluster()),
        {
            "actor": {"node_group": "learner", "placement": "0-3"},
            "env": {"node_group": "sim", "placement": "0:0-1"},
        },
    )
    actor0, env0 = plan.process("actor", 0), plan.process("env", 0)
    assert actor0.node_rank == env0.node_rank == 0
    assert actor0.python_interpreter_path == "/opt/learner/bin/python"
    assert dict(actor0.env_vars) == {"NCCL_SOCKET_IFNAME": "ib0", "CUDA_VISIBLE_DEVICES": "0"}
    assert env0.python_interpreter_path == "/opt/sim/bin/python"
    # `sim` has no accelerators of its own, but node 0 has: its resources are accelerators.
    assert dict(env0.env_vars) == {"MUJOCO_GL": "egl", "CUDA_VISIBLE_DEVICES": "0"}
    actor3 = plan.process("actor", 3)
    assert (actor3.node_rank, actor3.python_interpreter_path) == (1, "/opt/learner/bin/python")


def test_the_reserved_node_group_needs_the_node_interpreter_to_be_one():
    cluster = cluster_from_dict(shared_node_cluster())
    # Node 1 is only in `learner`: one interpreter, and every env var of the node.
    plan = resolve_placement(cluster, {"agent": {"node_group": "node", "placement": "1"}})
    agent = plan.process("agent", 0)
    assert agent.python_interpreter_path == "/opt/learner/bin/python"
    assert agent.env_vars["NCCL_SOCKET_IFNAME"] == "ib0"
    # Node 0's groups name two interpreters: placing through `node` does not say which.
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(cluster, {"agent": {"node_group": "node", "placement": "0-1"}})
    (issue,) = caught.value.issues
    assert issue.rule == "placement.interpreter_ambiguous"
    assert "node 0" in issue.message and "/opt/sim/bin/python" in issue.message


def test_env_var_keys_stay_unique_per_node_across_groups():
    section = shared_node_cluster()
    section["node_groups"][1]["env_configs"][0]["env_vars"].append({"NCCL_SOCKET_IFNAME": "eth0"})
    with pytest.raises(ClusterConfigError) as caught:
        cluster_from_dict(section)
    assert [issue.rule for issue in caught.value.issues] == ["env_var.duplicate"]


IGNORING = """\
cluster:
  num_nodes: 3
  node_groups:
    - label: gpu
      node_ranks: 0
      accelerators: {type: A100, count: 4}
    - label: sim
      node_ranks: 1-2
      accelerators: {type: L4, count: 2}
      ignore_hardware: True
  component_placement:
    actor: {node_group: gpu, placement: 0-3}
    env: {node_group: sim, placement: "0-1:0-3"}
"""


def test_ignore_hardware_makes_a_group_s_nodes_its_resources():
    cluster = load_cluster_yaml(IGNORING)
    assert cluster.group("sim").ignore_hardware is True
    plan = resolve_placement(cluster)
    env = plan.components["env"]
    assert [(p.node_rank, p.resource_kind, p.resource_ranks) for p in env] == [
        (1, "node", (0,)),
        (1, "node", (0,)),
        (2, "node", (1,)),
        (2, "node", (1,)),
    ]
    # Placed per node, each process sees the node's two GPUs.
    assert {p.env_vars["CUDA_VISIBLE_DEVICES"] for p in env} == {"0,1"}
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(cluster, {"env": {"node_group": "sim", "placement": "2"}})
    assert "node group 'sim' has 2 nodes" in caught.value.issues[0].message


def test_ignore_hardware_survives_the_round_trips():
    cluster = load_cluster_yaml(IGNORING)
    section = cluster_to_dict(cluster)
    assert section["node_groups"][1]["ignore_hardware"] is True
    assert "ignore_hardware" not in section["node_groups"][0]
    assert cluster_from_dict(section) == cluster
    text = dump_cluster_yaml(cluster)
    assert "ignore_hardware: true" in text
    assert load_cluster_yaml(text) == cluster


@pytest.mark.parametrize(
    ("group", "rule"),
    [
        ({"ignore_hardware": "yes"}, "node_group.ignore_hardware"),
        (
            {
                "ignore_hardware": True,
                "hardware": {"type": "Franka", "configs": [{"node_rank": 1}]},
            },
            "node_group.ignore_hardware_conflict",
        ),
    ],
)
def test_ignore_hardware_must_be_a_boolean_and_not_contradict_declared_hardware(group, rule):
    section = {"num_nodes": 2, "node_groups": [{"label": "sim", "node_ranks": "0-1", **group}]}
    with pytest.raises(ClusterConfigError) as caught:
        cluster_from_dict(section)
    (issue,) = caught.value.issues
    assert issue.rule == rule
    assert issue.location == "cluster.node_groups[0].ignore_hardware"


LISTED = """\
cluster:
  num_nodes: 2
  node_groups:
    - {label: gpu, node_ranks: 0, accelerators: {type: A100, count: 2}}
    - label: robot
      node_ranks: 1
      hardware: {type: Franka, configs: [{node_rank: 1}]}
  component_placement:
    env:
      node_group: %s
      placement: 0-2
"""


@pytest.mark.parametrize(
    "spelling", ["[robot, gpu]", "[' robot', gpu]", "\n        - robot\n        - gpu"]
)
def test_a_yaml_list_of_node_groups_means_the_comma_separated_text(spelling):
    listed = load_cluster_yaml(LISTED % spelling)
    text = load_cluster_yaml(LISTED % '"robot,gpu"')
    assert listed == text  # the same cluster, stored, exported and compared alike
    assert listed.component_placement["env"]["node_group"] == "robot,gpu"
    assert 'node_group: "robot,gpu"' in dump_cluster_yaml(listed)
    plan = resolve_placement(listed)
    assert [(p.node_group, p.node_rank) for p in plan.components["env"]] == [
        ("robot", 1),
        ("gpu", 0),
        ("gpu", 0),
    ]


@pytest.mark.parametrize("value", [[], ["robot", ""], ["robot", ["gpu"]], ["robot", True]])
def test_a_malformed_node_group_list_is_still_rejected(value):
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(
            load_cluster_yaml(LISTED % '"robot"'),
            {"env": {"node_group": value, "placement": "0"}},
        )
    assert [issue.rule for issue in caught.value.issues] == ["placement.node_group_syntax"]


def test_the_simulators_and_robots_example_resolves_as_its_comments_say():
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples/clusters/simulators_and_robots.yaml"
    plan = resolve_placement(load_cluster_yaml(example.read_text()))
    env = plan.components["env"]
    assert [(p.node_group, p.node_rank, p.python_interpreter_path) for p in env] == [
        ("sim", 1, "/opt/venv/sim/bin/python3"),
        ("sim", 1, "/opt/venv/sim/bin/python3"),
        ("sim", 2, "/opt/venv/sim/bin/python3"),
        ("sim", 2, "/opt/venv/sim/bin/python3"),
        ("robot", 2, "/opt/venv/franka/bin/python3"),
    ]
    assert dict(env[4].env_vars) == {"ROS_DOMAIN_ID": "7", "CUDA_VISIBLE_DEVICES": "0"}
    assert dict(plan.process("logger", 0).env_vars) == {
        "NCCL_SOCKET_IFNAME": "eth0",
        "CUDA_VISIBLE_DEVICES": "",
    }
