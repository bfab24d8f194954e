"""Each inventory rule of the seed, broken once, gives its own clear error."""

import copy

import pytest

from trainer.cluster import (
    Accelerators,
    Cluster,
    ClusterConfigError,
    EnvConfig,
    NodeGroup,
    cluster_from_dict,
    ensure_valid,
)

VALID = {
    "num_nodes": 4,
    "node_groups": [
        {
            "label": "gpu",
            "node_ranks": "0-1",
            "accelerators": {"type": "A800", "count": 8},
            "env_configs": [
                {
                    "node_ranks": 0,
                    "env_vars": [{"GLOO_SOCKET_IFNAME": "eth0"}],
                    "python_interpreter_path": "/opt/venv/bin/python",
                },
                {"node_ranks": 1, "env_vars": [{"GLOO_SOCKET_IFNAME": "eth1"}]},
            ],
        },
        {
            "label": "robot",
            "node_ranks": "2-3",
            "hardware": {
                "type": "Franka",
                "configs": [
                    {"robot_ip": "192.0.2.1", "node_rank": 2, "camera_serials": ["0123"]},
                    {"robot_ip": "192.0.2.2", "node_rank": 3},
                ],
            },
        },
    ],
}


def errors_for(mutate):
    section = copy.deepcopy(VALID)
    mutate(section)
    with pytest.raises(ClusterConfigError) as caught:
        cluster_from_dict(section)
    return caught.value.issues


def only_issue(mutate):
    issues = errors_for(mutate)
    assert len(issues) == 1, [str(i) for i in issues]
    return issues[0]


def test_the_valid_inventory_loads():
    cluster = cluster_from_dict(VALID)
    assert cluster.node(0).env_vars == {"GLOO_SOCKET_IFNAME": "eth0"}
    assert cluster.node(0).python_interpreter_path == "/opt/venv/bin/python"
    assert cluster.node(1).accelerators == Accelerators("A800", 8)
    assert cluster.node(2).accelerators is None


@pytest.mark.parametrize(
    ("value", "rule"),
    [
        (0, "cluster.num_nodes"),
        (-3, "cluster.num_nodes"),
        (True, "cluster.num_nodes"),
        ("4", "cluster.num_nodes"),
        (10**9, "cluster.num_nodes"),
    ],
)
def test_it_rejects_a_bad_num_nodes(value, rule):
    issue = only_issue(lambda s: s.update(num_nodes=value))
    assert issue.rule == rule
    assert issue.location == "cluster.num_nodes"


def test_it_requires_num_nodes():
    assert only_issue(lambda s: s.pop("num_nodes")).rule == "cluster.num_nodes"


@pytest.mark.parametrize("label", ["cluster", "node"])
def test_it_rejects_reserved_labels(label):
    issue = only_issue(lambda s: s["node_groups"][1].update(label=label))
    assert issue.rule == "node_group.label_reserved"
    assert f"'{label}' is reserved" in issue.message
    assert issue.location == "cluster.node_groups[1].label"


def test_it_rejects_duplicate_labels_but_labels_are_case_sensitive():
    issue = only_issue(lambda s: s["node_groups"][1].update(label="gpu"))
    assert issue.rule == "node_group.label_duplicate"
    assert "node_groups[0] and node_groups[1]" in issue.message
    section = copy.deepcopy(VALID)
    section["node_groups"][1]["label"] = "GPU"
    assert [g.label for g in cluster_from_dict(section).node_groups] == ["gpu", "GPU"]


def test_it_rejects_a_label_with_a_comma():
    issue = only_issue(lambda s: s["node_groups"][1].update(label="a,b"))
    assert issue.rule == "node_group.label"


def test_it_reads_a_numeric_label_as_text():
    section = copy.deepcopy(VALID)
    section["node_groups"][1]["label"] = 4090
    assert cluster_from_dict(section).node_groups[1].label == "4090"


@pytest.mark.parametrize(
    ("ranks", "rule", "text"),
    [
        ("0-9", "node_ranks.out_of_range", "the cluster has 4 nodes"),
        ("3-1", "node_ranks.invalid", "runs backwards"),
        ("0-1,1", "node_ranks.invalid", "listed more than once"),
        ("zero", "node_ranks.invalid", "not a rank or a range"),
        ([], "node_ranks.invalid", "empty"),
        (-1, "node_ranks.invalid", "negative"),
    ],
)
def test_it_rejects_bad_node_ranks(ranks, rule, text):
    issue = only_issue(lambda s: s["node_groups"][1].update(node_ranks=ranks))
    assert issue.rule == rule
    assert text in issue.message
    assert issue.location == "cluster.node_groups[1].node_ranks"


def test_it_accepts_node_ranks_as_lists_and_mixed_ranges():
    section = copy.deepcopy(VALID)
    section["node_groups"][1]["node_ranks"] = ["2", 3]
    assert cluster_from_dict(section).node_groups[1].node_ranks == (2, 3)


def test_an_env_config_must_be_a_subset_of_its_group():
    issue = only_issue(lambda s: s["node_groups"][0]["env_configs"][1].update(node_ranks="1-2"))
    assert issue.rule == "env_config.not_subset"
    assert "covers node 2, outside the group (its node_ranks are 0-1)" in issue.message


def test_env_configs_of_a_group_must_not_overlap():
    def mutate(section):
        env = section["node_groups"][0]["env_configs"][1]
        env["node_ranks"] = "0-1"
        env["env_vars"] = [{"OTHER": "x"}]

    issue = only_issue(mutate)
    assert issue.rule == "env_config.overlap"
    assert "env_configs[1]" in issue.message and "env_configs[0]" in issue.message
    assert "node 0" in issue.message


def test_an_env_var_key_is_set_once_per_node_across_groups():
    def mutate(section):
        section["node_groups"].append(
            {
                "label": "extra",
                "node_ranks": "0",
                "env_configs": [{"node_ranks": 0, "env_vars": [{"GLOO_SOCKET_IFNAME": "eth9"}]}],
            }
        )

    issue = only_issue(mutate)
    assert issue.rule == "env_var.duplicate"
    assert "GLOO_SOCKET_IFNAME" in issue.message and "node 0" in issue.message
    assert issue.location == "cluster.node_groups[2].env_configs[0].env_vars[0]"


def test_an_env_var_key_is_set_once_within_one_config():
    issue = only_issue(
        lambda s: s["node_groups"][0]["env_configs"][1]["env_vars"].append(
            {"GLOO_SOCKET_IFNAME": "x"}
        )
    )
    assert issue.rule == "env_var.duplicate"


def test_a_group_gives_a_node_at_most_one_interpreter():
    def mutate(section):
        section["node_groups"][0]["env_configs"].append(
            {"node_ranks": 0, "python_interpreter_path": "/usr/bin/python3"}
        )

    issues = errors_for(mutate)
    assert {issue.rule for issue in issues} == {"env_config.overlap", "interpreter.duplicate"}
    (issue,) = [issue for issue in issues if issue.rule == "interpreter.duplicate"]
    assert "node 0" in issue.message


def test_groups_sharing_a_node_may_name_different_interpreters():
    section = copy.deepcopy(VALID)
    section["node_groups"].append(
        {
            "label": "extra",
            "node_ranks": "0",
            "env_configs": [{"node_ranks": 0, "python_interpreter_path": "/usr/bin/python3"}],
        }
    )
    node = cluster_from_dict(section).node(0)
    assert node.python_interpreters == {"gpu": "/opt/venv/bin/python", "extra": "/usr/bin/python3"}
    assert node.python_interpreter_path is None  # the node alone does not say which


def test_the_interpreter_path_must_be_absolute():
    issue = only_issue(
        lambda s: s["node_groups"][0]["env_configs"][0].update(python_interpreter_path="python3")
    )
    assert issue.rule == "interpreter.path"


@pytest.mark.parametrize(
    ("env_vars", "rule"),
    [
        ({"A": "1"}, "env_var.format"),
        ([{"A": "1", "B": "2"}], "env_var.format"),
        (["A=1"], "env_var.format"),
        ([{"A": 1.5}], "env_var.value"),
        ([{"A": True}], "env_var.value"),
        ([{"A": None}], "env_var.value"),
        ([{"1A": "x"}], "env_var.key"),
        ([{"CUDA_VISIBLE_DEVICES": "0"}], "env_var.reserved"),
    ],
)
def test_it_rejects_malformed_env_vars(env_vars, rule):
    issue = only_issue(lambda s: s["node_groups"][0]["env_configs"][1].update(env_vars=env_vars))
    assert issue.rule == rule


def test_an_integer_env_var_value_is_read_as_text():
    section = copy.deepcopy(VALID)
    section["node_groups"][0]["env_configs"][1]["env_vars"].append({"OMP_NUM_THREADS": 4})
    assert cluster_from_dict(section).node(1).env_vars["OMP_NUM_THREADS"] == "4"


def test_an_env_config_needs_node_ranks():
    issue = only_issue(lambda s: s["node_groups"][0]["env_configs"][1].pop("node_ranks"))
    assert issue.rule == "node_ranks.missing"


@pytest.mark.parametrize(
    ("mutate_hardware", "rule"),
    [
        (lambda h: h.pop("type"), "hardware.type"),
        (lambda h: h.update(configs=[]), "hardware.configs"),
        (lambda h: h["configs"][1].update(node_rank=0), "hardware.node_rank"),
        (lambda h: h["configs"][1].pop("node_rank"), "hardware.node_rank"),
        (lambda h: h["configs"][1].update(robot_ip="robot.local"), "hardware.robot_ip"),
        (
            lambda h: h["configs"][0].update(camera_serials=[322142001230]),
            "hardware.camera_serials",
        ),
    ],
)
def test_it_rejects_malformed_hardware(mutate_hardware, rule):
    issue = only_issue(lambda s: mutate_hardware(s["node_groups"][1]["hardware"]))
    assert issue.rule == rule
    assert "robot" in issue.message


def test_hardware_keeps_unknown_fields_for_export():
    section = copy.deepcopy(VALID)
    section["node_groups"][1]["hardware"]["configs"][1]["gripper"] = "robotiq"
    config = cluster_from_dict(section).node_groups[1].hardware.configs[1]
    assert config.extra == {"gripper": "robotiq"}


@pytest.mark.parametrize(
    ("accelerators", "rule"),
    [
        ({"type": "A800", "count": 0}, "accelerators.count"),
        ({"type": "A800"}, "accelerators.count"),
        ({"count": 8}, "accelerators.type"),
        ({"type": "A800", "count": 8, "vendor": "intel"}, "accelerators.vendor"),
        ("A800x8", "accelerators.format"),
    ],
)
def test_it_rejects_malformed_accelerators(accelerators, rule):
    issue = only_issue(lambda s: s["node_groups"][0].update(accelerators=accelerators))
    assert issue.rule == rule


def test_a_node_has_one_set_of_accelerators():
    issue = only_issue(
        lambda s: s.update(accelerators=[{"node_ranks": "1", "type": "H100", "count": 8}])
    )
    assert issue.rule == "accelerators.conflict"
    assert "node 1" in issue.message


def test_cluster_level_accelerators_declare_any_nodes():
    section = copy.deepcopy(VALID)
    section["accelerators"] = [{"node_ranks": "2-3", "type": "L4", "count": 1}]
    cluster = cluster_from_dict(section)
    assert cluster.node(3).accelerators == Accelerators("L4", 1)


@pytest.mark.parametrize(
    ("where", "key"),
    [
        ((), "num_gpus"),
        (("node_groups", 0), "nodes"),
        (("node_groups", 0, "env_configs", 0), "vars"),
    ],
)
def test_it_rejects_unknown_keys(where, key):
    def mutate(section):
        target = section
        for part in where:
            target = target[part]
        target[key] = 1

    issue = only_issue(mutate)
    assert issue.rule == "config.unknown_key"
    assert f"unknown key '{key}'" in issue.message


def test_it_reports_every_problem_at_once():
    def mutate(section):
        section["node_groups"][0]["label"] = "node"
        section["node_groups"][0]["env_configs"][1]["node_ranks"] = "5"
        section["node_groups"][0]["env_configs"][0]["python_interpreter_path"] = "py"
        section["node_groups"][1]["hardware"]["configs"][0]["robot_ip"] = "nope"
        section["node_groups"][1]["node_ranks"] = "2-99"
        section["bogus"] = 1

    rules = sorted(issue.rule for issue in errors_for(mutate))
    assert rules == sorted(
        [
            "node_group.label_reserved",
            "node_ranks.out_of_range",
            "interpreter.path",
            "hardware.robot_ip",
            "node_ranks.out_of_range",
            "config.unknown_key",
        ]
    )


def test_errors_are_structured_for_an_api():
    issue = only_issue(lambda s: s["node_groups"][1].update(label="node"))
    data = issue.to_dict()
    assert data["rule"] == "node_group.label_reserved"
    assert data["path"] == ["cluster", "node_groups", 1, "label"]
    assert data["location"] == "cluster.node_groups[1].label"
    assert set(data) == {"rule", "message", "path", "location", "component", "segment", "line"}


def test_a_cluster_built_in_python_is_checked_by_ensure_valid_and_resolve():
    cluster = Cluster(
        num_nodes=2,
        node_groups=(
            NodeGroup("gpu", (0, 1), env_configs=(EnvConfig((0, 5)),)),
            NodeGroup("gpu", (1,)),
        ),
    )
    with pytest.raises(ClusterConfigError) as caught:
        ensure_valid(cluster)
    assert {i.rule for i in caught.value.issues} == {
        "node_group.label_duplicate",
        "node_ranks.out_of_range",
    }


def test_entries_that_cannot_be_read_are_left_out_and_the_rest_still_checked():
    def mutate(section):
        section["node_groups"].insert(0, 42)  # not a node group: reported, left out
        section["node_groups"][1]["accelerators"] = {"type": "A800", "count": "8"}
        section["node_groups"][1]["env_configs"][0]["env_vars"] = [{"A": 1.5}]
        section["node_groups"][2]["label"] = "node"  # semantic: still checked

    found = sorted((issue.rule, issue.location) for issue in errors_for(mutate))
    assert found == [
        ("accelerators.count", "cluster.node_groups[1].accelerators.count"),
        ("env_var.value", "cluster.node_groups[1].env_configs[0].env_vars[0].A"),
        ("node_group.label_reserved", "cluster.node_groups[2].label"),
        ("node_group.type", "cluster.node_groups[0]"),
    ]


def test_a_wrong_num_nodes_does_not_hide_the_other_structural_problems():
    def mutate(section):
        section["num_nodes"] = "four"
        section["node_groups"][0]["ignore_hardware"] = "yes"

    assert sorted(issue.rule for issue in errors_for(mutate)) == [
        "cluster.num_nodes",
        "node_group.ignore_hardware",
    ]
