"""Every placement example of the seed (RLinf's heterogeneous-cluster guide), with its exact
expected plan."""

from pathlib import Path

import pytest

from trainer.cluster import (
    ClusterConfigError,
    cluster_from_dict,
    load_cluster_yaml,
    resolve_placement,
)

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "clusters"


def gpu_cluster(num_nodes: int, gpus: int) -> dict:
    return {
        "num_nodes": num_nodes,
        "node_groups": [
            {
                "label": "gpu",
                "node_ranks": f"0-{num_nodes - 1}",
                "accelerators": {"type": "A800", "count": gpus},
            }
        ],
    }


def rows(plan, component):
    """(process, node, local rank, local world size, resources, node-local, CUDA); CUDA is
    None when the process is left its node's own visibility."""
    return [
        (
            p.process_rank,
            p.node_rank,
            p.local_rank,
            p.local_world_size,
            p.resource_ranks,
            p.local_hardware_ranks,
            p.env_vars.get("CUDA_VISIBLE_DEVICES"),
        )
        for p in plan.components[component]
    ]


def test_it_resolves_the_mixed_explicit_and_inferred_example():
    # 0-1:0-3,3-5,7-10:7-14 -> processes 0-3 share resources 0-1, 4-6 take 3-5 one each,
    # 7-14 take 7-10 two each. Two nodes of 8 GPUs: resources 8-10 are on node 1.
    cluster = cluster_from_dict(gpu_cluster(2, 8))
    plan = resolve_placement(cluster, {"actor": "0-1:0-3,3-5,7-10:7-14"})
    node0, node1 = 9, 6  # processes per node
    assert rows(plan, "actor") == [
        (0, 0, 0, node0, (0,), (0,), "0"),
        (1, 0, 1, node0, (0,), (0,), "0"),
        (2, 0, 2, node0, (1,), (1,), "1"),
        (3, 0, 3, node0, (1,), (1,), "1"),
        (4, 0, 4, node0, (3,), (3,), "3"),
        (5, 0, 5, node0, (4,), (4,), "4"),
        (6, 0, 6, node0, (5,), (5,), "5"),
        (7, 0, 7, node0, (7,), (7,), "7"),
        (8, 0, 8, node0, (7,), (7,), "7"),
        (9, 1, 0, node1, (8,), (0,), "0"),
        (10, 1, 1, node1, (8,), (0,), "0"),
        (11, 1, 2, node1, (9,), (1,), "1"),
        (12, 1, 3, node1, (9,), (1,), "1"),
        (13, 1, 4, node1, (10,), (2,), "2"),
        (14, 1, 5, node1, (10,), (2,), "2"),
    ]
    assert plan.world_size("actor") == 15


def test_it_infers_consecutive_process_ranks_for_plain_segments():
    plan = resolve_placement(cluster_from_dict(gpu_cluster(1, 8)), {"actor": "0-3,4-7"})
    assert [(p.process_rank, p.resource_ranks) for p in plan.components["actor"]] == [
        (rank, (rank,)) for rank in range(8)
    ]


def test_it_resolves_the_short_form_shared_by_two_components():
    cluster = cluster_from_dict(gpu_cluster(1, 8))
    plan = resolve_placement(cluster, {"actor,inference": "0-7"})
    assert list(plan.components) == ["actor", "inference"]
    for component in ("actor", "inference"):
        assert rows(plan, component) == [
            (rank, 0, rank, 8, (rank,), (rank,), str(rank)) for rank in range(8)
        ]
        assert {p.node_group for p in plan.components[component]} == {"cluster"}


def test_it_shares_each_robot_between_two_env_processes():
    # `env: {node_group: robot, placement: 0-3:0-7}`: 8 processes on 4 robots, 2 each.
    section = {
        "num_nodes": 2,
        "node_groups": [
            {
                "label": "robot",
                "node_ranks": "0-1",
                "hardware": {
                    "type": "Franka",
                    "configs": [
                        {"robot_ip": f"192.0.2.{i + 1}", "node_rank": i // 2} for i in range(4)
                    ],
                },
            }
        ],
    }
    plan = resolve_placement(
        cluster_from_dict(section), {"env": {"node_group": "robot", "placement": "0-3:0-7"}}
    )
    assert rows(plan, "env") == [
        (0, 0, 0, 4, (0,), (0,), None),
        (1, 0, 1, 4, (0,), (0,), None),
        (2, 0, 2, 4, (1,), (1,), None),
        (3, 0, 3, 4, (1,), (1,), None),
        (4, 1, 0, 4, (2,), (0,), None),
        (5, 1, 1, 4, (2,), (0,), None),
        (6, 1, 2, 4, (3,), (1,), None),
        (7, 1, 3, 4, (3,), (1,), None),
    ]
    process = plan.process("env", 5)
    assert process.resource_kind == "hardware"
    assert process.hardware_type == "Franka"
    assert process.visible_accelerators == ()
    assert [c.robot_ip for c in plan.hardware_configs(process)] == ["192.0.2.3"]


def test_it_places_processes_by_node_rank_on_the_node_group():
    # `agent: {node_group: node, placement: 0-1:0-199,2-3:200-399}`
    section = gpu_cluster(4, 2)
    section["node_groups"][0]["env_configs"] = [
        {"node_ranks": "0-3", "env_vars": [{"GLOO_SOCKET_IFNAME": "eth0"}]}
    ]
    plan = resolve_placement(
        cluster_from_dict(section),
        {"agent": {"node_group": "node", "placement": "0-1:0-199,2-3:200-399"}},
    )
    agents = plan.components["agent"]
    assert len(agents) == 400
    for process in agents:
        node = process.process_rank // 100
        assert process.node_rank == node
        assert process.local_rank == process.process_rank % 100
        assert process.local_world_size == 100
        assert process.resource_ranks == (node,)
        assert process.resource_kind == "node"
        assert process.local_hardware_ranks == ()  # no hardware placement on `node`
        # Placed per node: it sees every accelerator of its node, as in RLinf.
        assert process.visible_accelerators == (0, 1)
        assert dict(process.env_vars) == {
            "GLOO_SOCKET_IFNAME": "eth0",
            "CUDA_VISIBLE_DEVICES": "0,1",
        }


def test_it_gives_a_process_spanning_several_gpus_all_of_them():
    plan = resolve_placement(cluster_from_dict(gpu_cluster(2, 4)), {"actor": "0-7:0-3"})
    assert rows(plan, "actor") == [
        (0, 0, 0, 2, (0, 1), (0, 1), "0,1"),
        (1, 0, 1, 2, (2, 3), (2, 3), "2,3"),
        (2, 1, 0, 2, (4, 5), (0, 1), "0,1"),
        (3, 1, 1, 2, (6, 7), (2, 3), "2,3"),
    ]


def test_it_counts_nodes_as_resources_in_a_group_without_accelerators():
    section = {"num_nodes": 3, "node_groups": [{"label": "cpu", "node_ranks": "1-2"}]}
    plan = resolve_placement(
        cluster_from_dict(section), {"worker": {"node_group": "cpu", "placement": "0-1:0-3"}}
    )
    assert [(p.node_rank, p.resource_ranks, p.local_hardware_ranks) for p in plan.processes] == [
        (1, (0,), (0,)),
        (1, (0,), (0,)),
        (2, (1,), (0,)),
        (2, (1,), (0,)),
    ]
    assert {p.resource_kind for p in plan.processes} == {"node"}


def test_it_imports_and_resolves_the_18_node_example():
    cluster = load_cluster_yaml((EXAMPLES / "heterogeneous_18_nodes.yaml").read_text())
    assert cluster.num_nodes == 18
    assert [g.label for g in cluster.node_groups] == ["a800", "4090", "franka"]
    plan = resolve_placement(cluster)
    assert {name: plan.world_size(name) for name in plan.components} == {
        "actor": 64,
        "rollout": 64,
        "env": 2,
        "agent": 400,
    }
    for process in plan.components["actor"]:
        assert process.node_rank == process.process_rank // 8
        assert process.local_rank == process.process_rank % 8
        assert process.env_vars["CUDA_VISIBLE_DEVICES"] == str(process.process_rank % 8)
        assert process.env_vars["GLOO_SOCKET_IFNAME"] == "eth0"
        assert process.python_interpreter_path == "/opt/venv/openpi/bin/python3"
        assert process.hardware_type == "A800"
    for process in plan.components["rollout"]:
        assert process.node_rank == 8 + process.process_rank // 8
        assert process.env_vars["GLOO_SOCKET_IFNAME"] == "eth1"
        assert process.python_interpreter_path is None
    env0, env1 = plan.components["env"]
    assert (env0.node_rank, env1.node_rank) == (16, 17)
    assert [c.camera_serials for c in plan.hardware_configs(env1)] == [
        ("322142001232", "322142001233")
    ]
    agents = plan.components["agent"]
    assert [agents[i].node_rank for i in (0, 99, 100, 199, 200, 299, 300, 399)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
        3,
    ]
    # Agents run on a800 nodes: they inherit those nodes' env and interpreter, and see all
    # of the node's GPUs (placed per node, not on GPUs).
    assert dict(agents[0].env_vars) == {
        "GLOO_SOCKET_IFNAME": "eth0",
        "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7",
    }
    assert agents[0].python_interpreter_path == "/opt/venv/openpi/bin/python3"


def test_it_numbers_a_node_group_list_across_the_groups_in_order():
    cluster = load_cluster_yaml((EXAMPLES / "heterogeneous_18_nodes.yaml").read_text())
    plan = resolve_placement(cluster, {"actor": {"node_group": "a800,4090", "placement": "0-127"}})
    actor = plan.components["actor"]
    assert (actor[63].node_group, actor[63].node_rank, actor[63].local_hardware_ranks) == (
        "a800",
        7,
        (7,),
    )
    assert (actor[64].node_group, actor[64].node_rank, actor[64].local_hardware_ranks) == (
        "4090",
        8,
        (0,),
    )
    assert actor[64].env_vars["CUDA_VISIBLE_DEVICES"] == "0"
    assert actor[64].resource_ranks == (64,)
    # A YAML list of labels means the same.
    same = resolve_placement(
        cluster, {"actor": {"node_group": ["a800", "4090"], "placement": "0-127"}}
    )
    assert [p.to_dict() for p in same.processes] == [p.to_dict() for p in plan.processes]


def test_it_resolves_the_small_example():
    cluster = load_cluster_yaml((EXAMPLES / "two_nodes.yaml").read_text())
    plan = resolve_placement(cluster)
    assert {name: plan.world_size(name) for name in plan.components} == {
        "actor": 2,
        "inference": 2,
        "env": 4,
        "agent": 4,
    }


def test_the_seeds_second_example_as_written_reports_every_problem():
    # The seed's node-group example uses 0-8 (nine GPUs) on 8-GPU groups, node ranks 0-3 on
    # a 2-node cluster, and 0-1:0-200 (201 processes on 2 nodes): all three are rejected.
    section = {
        "num_nodes": 2,
        "node_groups": [
            {"label": "a800", "node_ranks": 0, "accelerators": {"type": "A800", "count": 8}},
            {"label": "4090", "node_ranks": 1, "accelerators": {"type": "RTX4090", "count": 8}},
            {
                "label": "robot",
                "node_ranks": "0-1",
                "hardware": {
                    "type": "Franka",
                    "configs": [{"robot_ip": f"192.0.2.{i}", "node_rank": i % 2} for i in range(4)],
                },
            },
        ],
    }
    placement = {
        "actor": {"node_group": "a800", "placement": "0-8"},
        "rollout": {"node_group": "4090", "placement": "0-8"},
        "env": {"node_group": "robot", "placement": "0-3:0-7"},
        "agent": {"node_group": "node", "placement": "0-1:0-200,2-3:201-511"},
    }
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(cluster_from_dict(section), placement)
    found = {(i.component, i.segment, i.rule) for i in caught.value.issues}
    assert found == {
        ("actor", "0-8", "placement.resource_out_of_range"),
        ("rollout", "0-8", "placement.resource_out_of_range"),
        ("agent", "0-1:0-200", "placement.whole_multiple"),
        ("agent", "2-3:201-511", "placement.whole_multiple"),
        ("agent", "2-3:201-511", "placement.resource_out_of_range"),
    }
