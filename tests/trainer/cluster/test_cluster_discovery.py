"""Building an inventory from a live Ray cluster's node list (`ray.nodes()` dicts)."""

import pytest

from trainer.cluster import (
    NODE_GROUP_LABEL,
    NODE_RANK_LABEL,
    Accelerators,
    ClusterConfigError,
    cluster_from_ray_nodes,
    resolve_placement,
)


def ray_node(node_id, rank=None, gpus=0, kind=None, group=None, alive=True):
    resources = {"CPU": 8.0, f"node:192.0.2.{node_id}": 1.0}
    if gpus:
        resources["GPU"] = float(gpus)
    if kind:
        resources[f"accelerator_type:{kind}"] = 1.0
    labels = {"ray.io/node-id": f"{node_id:056x}"}
    if rank is not None:
        labels[NODE_RANK_LABEL] = str(rank)
    if group is not None:
        labels[NODE_GROUP_LABEL] = group
    return {
        "NodeID": f"{node_id:056x}",
        "Alive": alive,
        "NodeManagerAddress": f"192.0.2.{node_id}",
        "Resources": resources,
        "Labels": labels,
    }


def test_it_reads_ranks_groups_and_accelerators_from_labels_and_resources():
    nodes = [
        ray_node(7, rank=2),
        ray_node(5, rank=0, gpus=8, kind="A100", group="train"),
        ray_node(6, rank=1, gpus=8, kind="A100", group="train"),
        ray_node(9, rank=3, alive=False),  # dead nodes are ignored
    ]
    cluster = cluster_from_ray_nodes(nodes)
    assert cluster.num_nodes == 3
    assert [(g.label, g.node_ranks) for g in cluster.node_groups] == [("train", (0, 1))]
    assert [(a.node_ranks, a.accelerators) for a in cluster.accelerators] == [
        ((0, 1), Accelerators("A100", 8))
    ]
    assert cluster.node(2).accelerators is None
    plan = resolve_placement(cluster, {"actor": {"node_group": "train", "placement": "0-15"}})
    assert plan.process("actor", 9).node_rank == 1


def test_a_single_unlabelled_node_is_rank_0():
    cluster = cluster_from_ray_nodes([ray_node(1, gpus=2)])
    assert cluster.num_nodes == 1
    assert cluster.node(0).accelerators == Accelerators("GPU", 2)


def test_ascend_npus_are_recognised():
    node = ray_node(1)
    node["Resources"]["NPU"] = 8.0
    cluster = cluster_from_ray_nodes([node])
    assert cluster.node(0).visibility_env_var == "ASCEND_RT_VISIBLE_DEVICES"


@pytest.mark.parametrize(
    ("nodes", "rule"),
    [
        ([ray_node(1), ray_node(2)], "discovery.missing_rank"),
        ([ray_node(1, rank=0), ray_node(2, rank=0)], "discovery.duplicate_rank"),
        ([ray_node(1, rank=0), ray_node(2, rank=2)], "discovery.rank_gap"),
        ([ray_node(1, rank="x"), ray_node(2, rank=0)], "discovery.bad_rank"),
        ([ray_node(1, alive=False)], "discovery.no_nodes"),
        ([ray_node(1, rank=0, group="node")], "node_group.label_reserved"),
    ],
)
def test_it_explains_what_is_wrong_with_the_live_cluster(nodes, rule):
    with pytest.raises(ClusterConfigError) as caught:
        cluster_from_ray_nodes(nodes)
    assert caught.value.issues[0].rule == rule
