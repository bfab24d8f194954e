"""A plan placed on a real two-node Ray cluster (`ray.cluster_utils.Cluster`, labelled nodes,
fake GPUs): every actor lands on its node and sees exactly its env; a plan the cluster
cannot satisfy fails clearly within a bounded time."""

import os
import stat
import sys
from pathlib import Path

import pytest
import ray

from tests.ray_cluster import labelled_ray_cluster
from trainer.cluster import (
    NODE_RANK_LABEL,
    cluster_from_ray_nodes,
    load_cluster_yaml,
    resolve_placement,
    resolve_placement_text,
)
from trainer.runtime.ray_placement import (
    PlacementUnsatisfiable,
    actor_options,
    create_placed_actors,
)

PROBED = ("CUDA_VISIBLE_DEVICES", "ARMATURE_TEST_NODE", "ARMATURE_INTERPRETER")


@ray.remote
class Probe:
    def __init__(self, component, rank):
        self.identity = (component, rank)

    def report(self):
        return {
            "identity": self.identity,
            "node_id": ray.get_runtime_context().get_node_id(),
            "env": {key: os.environ.get(key) for key in PROBED},
        }


@pytest.fixture(scope="module")
def ray_nodes():
    """Node rank -> Ray node id of a two-node cluster: node 0 with 2 fake GPUs, node 1 with 4."""
    with labelled_ray_cluster(
        [{"num_cpus": 2, "num_gpus": 2}, {"num_cpus": 2, "num_gpus": 4}]
    ) as tmp:
        ids = {int(n["Labels"][NODE_RANK_LABEL]): n["NodeID"] for n in ray.nodes() if n["Alive"]}
        yield ids, tmp


def interpreter_wrapper(directory: Path) -> str:
    """An interpreter that marks its processes, to prove the plan's interpreter is used."""
    path = directory / "python-wrapper"
    path.write_text(f'#!/bin/sh\nARMATURE_INTERPRETER=wrapper exec "{sys.executable}" "$@"\n')
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


def two_node_plan(interpreter: str, placement: str):
    return resolve_placement_text(
        load_cluster_yaml(
            f"""
cluster:
  num_nodes: 2
  component_placement:
    trainer: 0-1:0-1,2-5:2-3        # node 0: one GPU each; node 1: two GPUs each
    agent: {{node_group: node, placement: 0-1}}
  node_groups:
    - label: small
      node_ranks: 0
      accelerators: {{type: GPU, count: 2}}
      env_configs:
        - node_ranks: 0
          env_vars: [{{ARMATURE_TEST_NODE: zero}}]
    - label: big
      node_ranks: 1
      accelerators: {{type: GPU, count: 4}}
      env_configs:
        - node_ranks: 1
          python_interpreter_path: {interpreter}
          env_vars: [{{ARMATURE_TEST_NODE: one}}]
"""
        ),
        placement,
    )


PLACEMENT = "trainer: 0-1:0-1,2-5:2-3\nagent: {node_group: node, placement: 0-1}\n"


def test_every_actor_lands_on_its_node_with_exactly_its_env(ray_nodes):
    node_ids, tmp = ray_nodes
    live = cluster_from_ray_nodes(ray.nodes())
    assert [live.node(rank).num_accelerators for rank in (0, 1)] == [2, 4]
    plan = two_node_plan(interpreter_wrapper(tmp), PLACEMENT)
    actors = create_placed_actors(
        Probe,
        plan,
        constructor_args=lambda p: (p.component, p.process_rank),
        timeout_s=45,
    )
    reports = ray.get([actor.handle.report.remote() for actor in actors], timeout=30)
    seen = {report["identity"]: report for report in reports}
    expected = {
        ("trainer", 0): (0, {"CUDA_VISIBLE_DEVICES": "0", "ARMATURE_TEST_NODE": "zero"}),
        ("trainer", 1): (0, {"CUDA_VISIBLE_DEVICES": "1", "ARMATURE_TEST_NODE": "zero"}),
        ("trainer", 2): (
            1,
            {
                "CUDA_VISIBLE_DEVICES": "0,1",
                "ARMATURE_TEST_NODE": "one",
                "ARMATURE_INTERPRETER": "wrapper",
            },
        ),
        ("trainer", 3): (
            1,
            {
                "CUDA_VISIBLE_DEVICES": "2,3",
                "ARMATURE_TEST_NODE": "one",
                "ARMATURE_INTERPRETER": "wrapper",
            },
        ),
        # Placed per node: every GPU of the node, as RLinf does.
        ("agent", 0): (0, {"CUDA_VISIBLE_DEVICES": "0,1", "ARMATURE_TEST_NODE": "zero"}),
        ("agent", 1): (
            1,
            {
                "CUDA_VISIBLE_DEVICES": "0,1,2,3",
                "ARMATURE_TEST_NODE": "one",
                "ARMATURE_INTERPRETER": "wrapper",
            },
        ),
    }
    assert set(seen) == set(expected)
    for identity, (node_rank, env) in expected.items():
        assert seen[identity]["node_id"] == node_ids[node_rank], identity
        assert seen[identity]["env"] == {key: env.get(key) for key in PROBED}, identity
    for actor in actors:
        ray.kill(actor.handle)


def test_label_selector_pinning_lands_on_the_labelled_node(ray_nodes):
    node_ids, _ = ray_nodes
    plan = two_node_plan("/usr/bin/python3", "agent: {node_group: node, placement: 0-1}\n")
    process = plan.process("agent", 0)  # node 0: no interpreter override there
    actor = Probe.options(**actor_options(process)).remote("agent", 0)
    report = ray.get(actor.report.remote(), timeout=30)
    assert report["node_id"] == node_ids[0]
    assert report["env"]["ARMATURE_TEST_NODE"] == "zero"
    ray.kill(actor)


def test_a_plan_needing_a_missing_node_fails_at_once(ray_nodes):
    cluster = load_cluster_yaml(
        "cluster:\n  num_nodes: 3\n  component_placement:\n"
        "    agent: {node_group: node, placement: 0-2}\n"
    )
    with pytest.raises(PlacementUnsatisfiable) as caught:
        create_placed_actors(Probe, resolve_placement(cluster), constructor_args=lambda p: ("a", 0))
    # Found by the check before any actor is asked for (no wait for a timeout).
    assert "node rank 2 (components agent) is not in the Ray cluster" in str(caught.value)


def test_a_plan_needing_more_gpus_than_a_node_has_fails_at_once(ray_nodes):
    cluster = load_cluster_yaml(
        "cluster:\n  num_nodes: 2\n  component_placement: {actor: 0-7}\n  node_groups:\n"
        "    - {label: gpu, node_ranks: 0-1, accelerators: {type: GPU, count: 4}}\n"
    )
    with pytest.raises(PlacementUnsatisfiable) as caught:
        create_placed_actors(Probe, resolve_placement(cluster), constructor_args=lambda p: ("a", 0))
    assert caught.value.problems == ["node rank 0 needs accelerators 0-3 but Ray reports 2"]


def test_infeasible_actors_fail_at_once_with_rays_reason(ray_nodes):
    plan = two_node_plan("/usr/bin/python3", "agent: {node_group: node, placement: 0-1}\n")
    with pytest.raises(PlacementUnsatisfiable) as caught:
        create_placed_actors(
            Probe,
            plan,
            constructor_args=lambda p: (p.component, p.process_rank),
            num_cpus=16,  # more than any node has
            timeout_s=600,  # the test's own timeout (300 s) ends it first if this is waited
        )
    # Ray's own reason, reported as soon as Ray says so, not the timeout's.
    assert caught.value.problems[0].startswith(
        "agent[0] on node 0 failed to start: The actor is not schedulable"
    )


def test_actors_that_cannot_start_fail_within_the_timeout(ray_nodes):
    # Two agents on node 0, each asking for both of its CPUs: the first starts, the second
    # would wait forever for the first to finish.
    plan = two_node_plan("/usr/bin/python3", "agent: {node_group: node, placement: 0:0-1}\n")
    with pytest.raises(PlacementUnsatisfiable) as caught:
        create_placed_actors(
            Probe,
            plan,
            constructor_args=lambda p: (p.component, p.process_rank),
            num_cpus=2,
            # Long enough for the first worker to start on a busy 2-core machine (~4 s).
            timeout_s=10,
        )
    (problem,) = caught.value.problems
    assert problem.startswith("1 actor(s) did not start within 10 s: agent[1] on node 0")
    assert "each requests num_cpus=2; node 0: 2 CPUs" in problem
    assert "all actors of this plan were stopped" in problem
    # The agent that did start was stopped too: node 0's CPUs are free again.
    retry = Probe.options(**actor_options(plan.process("agent", 0), num_cpus=2)).remote("a", 0)
    assert ray.get(retry.report.remote(), timeout=30)["identity"] == ("a", 0)
    ray.kill(retry)
