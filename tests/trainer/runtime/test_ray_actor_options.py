"""Mapping a plan to Ray actor options, and checking it against live nodes (no Ray needed)."""

from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from trainer.cluster import NODE_RANK_LABEL, cluster_from_dict, resolve_placement
from trainer.runtime.ray_placement import actor_options, check_plan_against_nodes, runtime_env_for

CLUSTER = cluster_from_dict(
    {
        "num_nodes": 2,
        "component_placement": {
            "actor": "0-3:0-1",
            "agent": {"node_group": "node", "placement": "1"},
        },
        "node_groups": [
            {
                "label": "gpu",
                "node_ranks": "0-1",
                "accelerators": {"type": "A100", "count": 2},
                "env_configs": [
                    {
                        "node_ranks": 1,
                        "python_interpreter_path": "/opt/venv/bin/python",
                        "env_vars": [{"GLOO_SOCKET_IFNAME": "eth1"}],
                    }
                ],
            }
        ],
    }
)
PLAN = resolve_placement(CLUSTER)


def live_node(rank, gpus, kind=None):
    resources = {"CPU": 2.0, "GPU": float(gpus)}
    if kind:
        resources[f"accelerator_type:{kind}"] = 1.0
    return {
        "NodeID": f"{rank:056x}",
        "Alive": True,
        "NodeManagerAddress": "127.0.0.1",
        "Resources": resources,
        "Labels": {NODE_RANK_LABEL: str(rank)},
    }


def test_the_runtime_env_carries_env_visibility_and_interpreter():
    process = PLAN.process("actor", 1)
    assert runtime_env_for(process) == {
        "env_vars": {
            "GLOO_SOCKET_IFNAME": "eth1",
            "CUDA_VISIBLE_DEVICES": "0,1",
            "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1",
        },
        "py_executable": "/opt/venv/bin/python",
    }
    assert "py_executable" not in runtime_env_for(PLAN.process("actor", 0))


def test_actor_options_pin_by_label_by_default():
    options = actor_options(PLAN.process("agent", 0))
    assert options["label_selector"] == {NODE_RANK_LABEL: "1"}
    assert (options["num_cpus"], options["num_gpus"]) == (0, 0)
    assert options["runtime_env"]["env_vars"]["CUDA_VISIBLE_DEVICES"] == "0,1"  # per node: all
    assert "scheduling_strategy" not in options


def test_actor_options_pin_by_node_affinity_when_the_node_id_is_known():
    options = actor_options(PLAN.process("actor", 0), node_id="ab" * 28, num_cpus=1)
    strategy = options["scheduling_strategy"]
    assert isinstance(strategy, NodeAffinitySchedulingStrategy)
    assert (strategy.node_id, strategy.soft) == ("ab" * 28, False)
    assert options["num_cpus"] == 1
    assert "label_selector" not in options


def test_a_fitting_cluster_has_no_problems():
    assert check_plan_against_nodes(PLAN, [live_node(0, 2, "A100"), live_node(1, 2)]) == []


def test_missing_nodes_and_devices_are_reported():
    problems = check_plan_against_nodes(PLAN, [live_node(0, 1)])
    assert problems == [
        "node rank 1 (components actor, agent) is not in the Ray cluster, which has node 0; "
        "join one with `./armature join HEAD --node-rank 1` (a plain `ray start`: "
        f"--labels={NODE_RANK_LABEL}=1) or change the placement",
        "node rank 0 needs accelerators 0-1 but Ray reports 1",
    ]


def test_a_different_accelerator_type_is_reported():
    problems = check_plan_against_nodes(PLAN, [live_node(0, 2, "H100"), live_node(1, 2)])
    assert problems == ["node rank 0 has H100 accelerators but the plan expects A100"]


def test_unranked_live_nodes_are_reported():
    nodes = [live_node(0, 2), live_node(1, 2)]
    del nodes[1]["Labels"][NODE_RANK_LABEL]
    (problem,) = check_plan_against_nodes(PLAN, nodes)
    assert "have no 'armature.io/node-rank' label" in problem
