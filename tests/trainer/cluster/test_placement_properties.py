"""Property-based tests: random valid placements resolve consistently, and random input never
raises anything but `ClusterConfigError`."""

from collections import Counter, defaultdict

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trainer.cluster import (
    ClusterConfigError,
    cluster_from_dict,
    load_cluster_yaml,
    load_placement_yaml,
    resolve_placement,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def valid_specs(draw):
    """A cluster with one group (GPUs or robots) and a placement whose segments each obey the
    rules: resources split into chunks; each chunk either one process per resource (inferred),
    k processes per resource, or one process per aligned run of w resources on one node."""
    num_nodes = draw(st.integers(1, 5))
    per_node = draw(st.integers(1, 4))
    use_robots = draw(st.booleans())
    group = {"label": "g", "node_ranks": f"0-{num_nodes - 1}"}
    if use_robots:
        group["hardware"] = {
            "type": "Franka",
            "configs": [{"node_rank": n} for n in range(num_nodes) for _ in range(per_node)],
        }
    else:
        group["accelerators"] = {"type": "A800", "count": per_node}
    total = num_nodes * per_node
    segments, expectations = [], []
    resource, process = 0, 0
    while resource < total and draw(st.booleans() if segments else st.just(True)):
        resource += draw(st.integers(0, 2)) if resource + 2 < total else 0  # leave gaps
        if resource >= total:
            break
        mode = draw(st.sampled_from(["inferred", "shared", "spanning"]))
        widths = [w for w in range(1, per_node + 1) if per_node % w == 0]
        if mode == "spanning" and resource % per_node == 0 and len(widths) > 1:
            width = draw(st.sampled_from(widths[1:]))
            count = width * draw(st.integers(1, (total - resource) // width))
            processes = count // width
            text = f"{resource}-{resource + count - 1}:{process}-{process + processes - 1}"
        else:
            count = draw(st.integers(1, min(4, total - resource)))
            if mode == "shared":
                processes = count * draw(st.integers(1, 3))
                text = f"{resource}-{resource + count - 1}:{process}-{process + processes - 1}"
            else:
                processes = count
                text = f"{resource}-{resource + count - 1}"
        segments.append(text)
        expectations.append((resource, count, process, processes))
        resource += count
        process += processes
    order = draw(st.permutations(range(len(segments))))
    # Explicit process ranks may come in any order; inferred ones continue the count, so
    # keep segments in order when any is inferred.
    if all(":" in segment for segment in segments):
        segments = [segments[i] for i in order]
    section = {"num_nodes": num_nodes, "node_groups": [group]}
    return section, ",".join(segments), expectations, per_node


@SETTINGS
@given(valid_specs())
def test_random_valid_placements_resolve_consistently(spec):
    section, text, expectations, per_node = spec
    cluster = cluster_from_dict(section)
    placement = {"worker,twin": {"node_group": "g", "placement": text}}
    plan = resolve_placement(cluster, placement)
    workers = plan.components["worker"]
    expected_total = sum(processes for *_, processes in expectations)
    # Each process placed exactly once, ranks 0..N-1.
    assert [p.process_rank for p in workers] == list(range(expected_total))
    # Components sharing a rule get identical placements.
    assert [p.to_dict() | {"component": "x"} for p in workers] == [
        p.to_dict() | {"component": "x"} for p in plan.components["twin"]
    ]
    sharing = Counter()
    for first, count, process_first, processes in expectations:
        for rank in range(process_first, process_first + processes):
            process = workers[rank]
            owned = set(process.resource_ranks)
            assert owned <= set(range(first, first + count))
            sharing.update(owned)
            if processes < count:
                assert len(owned) == count // processes
    for first, count, _process_first, processes in expectations:
        for resource in range(first, first + count):
            assert sharing[resource] == max(1, processes // count)
    # A process's resources are on its node, and device sets are identical or disjoint.
    by_resources = defaultdict(list)
    for process in workers:
        assert {r // per_node for r in process.resource_ranks} == {process.node_rank}
        assert process.local_hardware_ranks == tuple(r % per_node for r in process.resource_ranks)
        by_resources[process.resource_ranks].append(process.process_rank)
    keys = list(by_resources)
    for i, a in enumerate(keys):
        for b in keys[i + 1 :]:
            assert not set(a) & set(b)
    # Visibility: exactly the process's own accelerators; robot processes on these nodes
    # (which declare no accelerators) are left the node's own visibility.
    for process in workers:
        if process.resource_kind == "accelerator":
            expected = ",".join(map(str, process.local_hardware_ranks))
            assert process.env_vars["CUDA_VISIBLE_DEVICES"] == expected
        else:
            assert "CUDA_VISIBLE_DEVICES" not in process.env_vars
    # Local ranks count the component's processes on each node.
    per_node_ranks = defaultdict(list)
    for process in workers:
        per_node_ranks[process.node_rank].append(process.local_rank)
    for node, locals_ in per_node_ranks.items():
        assert locals_ == list(range(len(locals_)))
        assert {p.local_world_size for p in workers if p.node_rank == node} == {len(locals_)}
    # Deterministic.
    again = resolve_placement(cluster, placement)
    assert [p.to_dict() for p in again.processes] == [p.to_dict() for p in plan.processes]


CLUSTER = cluster_from_dict(
    {
        "num_nodes": 3,
        "node_groups": [
            {"label": "gpu", "node_ranks": "0-1", "accelerators": {"type": "A800", "count": 4}},
            {
                "label": "robot",
                "node_ranks": "2",
                "hardware": {"type": "Franka", "configs": [{"node_rank": 2}, {"node_rank": 2}]},
            },
        ],
    }
)
GRAMMAR_ALPHABET = st.sampled_from(list("0123456789-:, ") + ["all", "10", "-1", "::", ",,"])
grammarish = st.lists(GRAMMAR_ALPHABET, max_size=20).map("".join)
anything = st.one_of(
    st.text(max_size=30),
    grammarish,
    st.integers(),
    st.floats(),
    st.none(),
    st.booleans(),
    st.lists(st.text(max_size=5), max_size=3),
)


def resolves_or_reports(cluster, placement):
    try:
        resolve_placement(cluster, placement)
    except ClusterConfigError as error:
        assert error.issues and all(issue.message for issue in error.issues)


@SETTINGS
@given(st.one_of(st.text(max_size=40), grammarish))
def test_random_strings_never_raise_anything_but_the_validation_error(text):
    resolves_or_reports(CLUSTER, {"actor": text})
    resolves_or_reports(CLUSTER, {"env": {"node_group": "robot", "placement": text}})
    resolves_or_reports(CLUSTER, {"agent": {"node_group": "node", "placement": text}})


@SETTINGS
@given(
    st.dictionaries(
        st.one_of(st.text(max_size=12), grammarish),
        st.one_of(
            anything,
            st.fixed_dictionaries(
                {},
                optional={
                    "node_group": st.one_of(anything, st.sampled_from(["gpu", "robot", "node"])),
                    "placement": st.one_of(anything, grammarish),
                },
            ),
        ),
        max_size=4,
    )
)
def test_random_placement_mappings_never_raise_anything_else(placement):
    resolves_or_reports(CLUSTER, placement)


@SETTINGS
@given(st.text(max_size=200))
def test_random_yaml_text_never_raises_anything_else(text):
    for load in (load_cluster_yaml, load_placement_yaml):
        try:
            load(text)
        except ClusterConfigError:
            pass
    resolves_or_reports(CLUSTER, text)


yaml_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-3, 30), st.text(max_size=8), grammarish),
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=12,
)


@SETTINGS
@given(
    st.fixed_dictionaries(
        {"num_nodes": st.one_of(st.integers(-1, 6), yaml_values)},
        optional={
            "node_groups": st.one_of(
                yaml_values,
                st.lists(
                    st.fixed_dictionaries(
                        {},
                        optional={
                            "label": yaml_values,
                            "node_ranks": st.one_of(yaml_values, grammarish),
                            "env_configs": yaml_values,
                            "hardware": yaml_values,
                            "accelerators": yaml_values,
                        },
                    ),
                    max_size=3,
                ),
            ),
            "accelerators": yaml_values,
            "component_placement": yaml_values,
        },
    )
)
def test_random_cluster_sections_never_raise_anything_else(section):
    try:
        cluster = cluster_from_dict(section)
    except ClusterConfigError:
        return
    if cluster.component_placement is not None:
        resolves_or_reports(cluster, None)
