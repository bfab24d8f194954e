"""Each placement rule, broken once: the error names the component, the segment and the rule."""

import pytest

from trainer.cluster import (
    Cluster,
    ClusterConfigError,
    NodeGroup,
    cluster_from_dict,
    resolve_placement,
)

CLUSTER = cluster_from_dict(
    {
        "num_nodes": 4,
        "node_groups": [
            {"label": "a800", "node_ranks": "0-1", "accelerators": {"type": "A800", "count": 4}},
            {"label": "4090", "node_ranks": "1-2", "accelerators": {"type": "A800", "count": 4}},
            {
                "label": "robot",
                "node_ranks": "3",
                "hardware": {
                    "type": "Franka",
                    "configs": [{"robot_ip": "192.0.2.1", "node_rank": 3}],
                },
            },
        ],
    }
)


def issues_for(placement):
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(CLUSTER, placement)
    return caught.value.issues


def only_issue(placement):
    issues = issues_for(placement)
    assert len(issues) == 1, [str(i) for i in issues]
    return issues[0]


def test_rlinfs_own_example_is_rejected_with_the_reason():
    issue = issues_for({"agent": {"node_group": "node", "placement": "0-1:0-200,2-3:201-511"}})[0]
    assert issue.rule == "placement.whole_multiple"
    assert (issue.component, issue.segment) == ("agent", "0-1:0-200")
    assert "201 processes (0-200) on 2 resources" in issue.message
    assert "neither count is a whole multiple of the other" in issue.message
    assert "0-199 (100 per resource) or 0-201 (101 per resource)" in issue.message
    assert issue.location == "cluster.component_placement.agent.placement"


def test_fewer_processes_than_resources_must_divide_them():
    issue = only_issue({"actor": {"node_group": "a800", "placement": "0-5:0-3"}})
    assert issue.rule == "placement.whole_multiple"
    assert "use a process count that divides 6 (1, 2, 3, 6)" in issue.message


@pytest.mark.parametrize(
    ("text", "rule", "segment", "fragment"),
    [
        ("", "placement.empty", None, "empty"),
        ("   ", "placement.empty", None, "empty"),
        ("0-1,,2-3", "placement.segment_syntax", "", "stray comma"),
        ("0-1,", "placement.segment_syntax", "", "stray comma"),
        ("0:1:2", "placement.segment_syntax", "0:1:2", "2 colons"),
        ("a-b", "placement.range_syntax", "a-b", "not a rank or a range"),
        ("3-1", "placement.range_syntax", "3-1", "runs backwards"),
        ("0-3:5-2", "placement.range_syntax", "0-3:5-2", "runs backwards"),
        ("-1", "placement.range_syntax", "-1", "not a rank or a range"),
        ("0-1:all", "placement.all_processes", "0-1:all", "'all' may name resources"),
        ("0-1:", "placement.range_syntax", "0-1:", "process ranks"),
        ("٣", "placement.range_syntax", "٣", "not a rank"),
    ],
)
def test_it_rejects_malformed_placement_strings(text, rule, segment, fragment):
    issue = only_issue({"actor": text})
    assert issue.rule == rule
    assert issue.component == "actor"
    assert issue.segment == segment
    assert fragment in issue.message


def test_out_of_range_resources_name_the_group_and_its_size():
    issue = only_issue({"env": {"node_group": "robot", "placement": "0-1"}})
    assert issue.rule == "placement.resource_out_of_range"
    assert "node group 'robot' has 1 Franka device (rank 0)" in issue.message


def test_resources_cannot_be_reused_across_segments():
    issue = only_issue({"actor": {"node_group": "a800", "placement": "0-3,2-5"}})
    assert issue.rule == "placement.resource_reused"
    assert issue.segment == "2-5"
    assert "resources 2-3 are already used by segment '0-3'" in issue.message


def test_process_ranks_must_not_have_gaps():
    issue = only_issue({"actor": {"node_group": "a800", "placement": "0-1:0-1,2-3:4-5"}})
    assert issue.rule == "placement.process_gap"
    assert "process ranks 2-3 are missing" in issue.message


def test_process_ranks_must_start_at_zero():
    issue = only_issue({"actor": {"node_group": "a800", "placement": "0:1"}})
    assert issue.rule == "placement.process_gap"
    assert "process rank 0 is missing" in issue.message


def test_process_ranks_must_not_repeat():
    issue = only_issue({"actor": {"node_group": "a800", "placement": "0-1:0-1,2-3:1-2"}})
    assert issue.rule == "placement.process_repeated"
    assert "process rank 1 is already placed by segment '0-1:0-1'" in issue.message


def test_process_ranks_may_be_written_out_of_order():
    plan = resolve_placement(
        CLUSTER, {"actor": {"node_group": "a800", "placement": "4-7:2-3,0-3:0-1"}}
    )
    assert [p.resource_ranks for p in plan.components["actor"]] == [
        (0, 1),
        (2, 3),
        (4, 5),
        (6, 7),
    ]


def test_a_process_cannot_span_nodes():
    issue = only_issue({"actor": {"node_group": "a800", "placement": "2-5:0"}})
    assert issue.rule == "placement.process_spans_nodes"
    assert "process 0 would get resources 2-5, which lie on nodes 0 and 1" in issue.message


def test_a_process_cannot_span_groups_of_a_list():
    issue = only_issue({"x": {"node_group": "a800,robot", "placement": "7-8:0"}})
    assert issue.rule == "placement.process_spans_nodes"
    assert "of different node groups" in issue.message


def test_a_process_cannot_span_nodes_on_the_node_group():
    issue = only_issue({"agent": {"node_group": "node", "placement": "0-1:0"}})
    assert issue.rule == "placement.process_spans_nodes"


def test_unknown_node_groups_are_named():
    issue = only_issue({"actor": {"node_group": "h100", "placement": "0-1"}})
    assert issue.rule == "placement.unknown_node_group"
    assert "'h100' does not exist (defined groups: a800, 4090, robot" in issue.message
    assert issue.location == "cluster.component_placement.actor.node_group"


def test_labels_are_case_sensitive_in_placements():
    assert only_issue({"actor": {"node_group": "A800", "placement": "0"}}).rule == (
        "placement.unknown_node_group"
    )


def test_reserved_groups_cannot_be_mixed_with_others():
    issue = only_issue({"actor": {"node_group": "node,a800", "placement": "0"}})
    assert issue.rule == "placement.node_group_mix"


def test_a_group_list_cannot_number_a_node_twice():
    issue = only_issue({"actor": {"node_group": "a800,4090", "placement": "0"}})
    assert issue.rule == "placement.node_group_overlap"
    assert "node 1 is in both 'a800' and '4090'" in issue.message


def test_a_group_list_cannot_repeat_a_label():
    issue = only_issue({"actor": {"node_group": "a800,a800", "placement": "0"}})
    assert issue.rule == "placement.node_group_repeated"


@pytest.mark.parametrize("value", ["", ",", 3.5, {"a": 1}, None])
def test_it_rejects_malformed_node_group_values(value):
    issue = only_issue({"actor": {"node_group": value, "placement": "0"}})
    assert issue.rule == "placement.node_group_syntax"


def test_a_component_is_placed_once():
    issue = only_issue({"actor": "0", "actor,critic": "1"})
    assert issue.rule == "placement.duplicate_component"
    assert issue.component == "actor"


@pytest.mark.parametrize("key", ["", "actor,", "a b", "actor,,critic"])
def test_component_names_must_be_words(key):
    assert only_issue({key: "0"}).rule == "placement.component_name"


def test_the_node_group_form_needs_a_placement_and_no_unknown_keys():
    assert only_issue({"actor": {"node_group": "a800"}}).rule == "placement.missing"
    issues = issues_for({"actor": {"node_group": "a800", "placment": "0"}})
    assert {i.rule for i in issues} == {"placement.unknown_key", "placement.missing"}


@pytest.mark.parametrize("value", [1.5, None, ["0-1"], True])
def test_a_placement_must_be_a_string(value):
    issue = only_issue({"actor": value})
    assert issue.rule == "placement.type"


def test_an_integer_placement_is_one_resource():
    plan = resolve_placement(CLUSTER, {"actor": 3})
    assert plan.process("actor", 0).resource_ranks == (3,)


@pytest.mark.parametrize("value", ["0-3", ["actor"], 3])
def test_the_placement_must_be_a_mapping(value):
    assert only_issue(value).rule == "placement.type"


def test_an_empty_placement_mapping_is_an_error():
    assert only_issue({}).rule == "placement.empty"


def test_a_huge_process_range_fails_fast():
    issue = only_issue({"actor": "0:0-999999999999"})
    assert issue.rule == "placement.too_many_processes"


def test_a_cluster_without_a_placement_says_so():
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(CLUSTER)
    assert caught.value.issues[0].rule == "placement.missing"


def test_every_problem_of_every_component_is_reported():
    issues = issues_for(
        {
            "actor": {"node_group": "a800", "placement": "0-1:0-2"},
            "rollout": {"node_group": "nope", "placement": "0"},
            "env": "0-1,,2",
            "agent": {"node_group": "node", "placement": "0-9"},
        }
    )
    assert sorted((i.component, i.rule) for i in issues) == [
        ("actor", "placement.whole_multiple"),
        ("agent", "placement.resource_out_of_range"),
        ("env", "placement.segment_syntax"),
        ("rollout", "placement.unknown_node_group"),
    ]


def test_placement_arithmetic_is_checked_even_when_the_inventory_is_broken():
    broken = Cluster(2, (NodeGroup("node", (0,)),))  # a reserved label
    with pytest.raises(ClusterConfigError) as caught:
        resolve_placement(broken, {"agent": "0-1:0-2"})
    assert {i.rule for i in caught.value.issues} == {
        "node_group.label_reserved",
        "placement.whole_multiple",
    }
