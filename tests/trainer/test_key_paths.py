"""One problem type and one key-path spelling for the experiment config and the cluster
section alike."""

import pytest

from trainer.cluster import ClusterConfigError, cluster_from_dict
from trainer.config import ConfigError, validate_config
from trainer.key_paths import ConfigIssue, format_key_path, line_of, parse_key_path, with_lines


@pytest.mark.parametrize(
    ("text", "parts"),
    [
        ("rollout.action_horizons_pattern[1]", ("rollout", "action_horizons_pattern", 1)),
        ("cluster.node_groups[0].env_configs[2]", ("cluster", "node_groups", 0, "env_configs", 2)),
        ("env", ("env",)),
        ("", ()),
        ("--tasks", ("--tasks",)),  # not a key path: kept as written
        ("a[b]", ("a[b]",)),
    ],
)
def test_a_key_path_reads_back_as_written(text, parts):
    assert parse_key_path(text) == parts
    assert format_key_path(parse_key_path(text)) == text


def test_an_issue_reads_with_its_line_and_location():
    issue = ConfigIssue("env.task_ids", "lists no task", ("env", "task_ids"))
    assert str(issue) == "env.task_ids: lists no task"
    lines = {("env",): 3, ("env", "task_ids"): 5}
    (located,) = with_lines([issue], lines)
    assert str(located) == "line 5: env.task_ids: lists no task"
    assert line_of(("env", "seed"), lines) == 3  # a missing key: where its parent is


def test_cluster_problems_keep_their_rule_and_path_in_a_config_error():
    section = {"num_nodes": 2, "node_groups": [{"label": "arm", "node_ranks": "0-5"}]}
    with pytest.raises(ClusterConfigError) as cluster_error:
        cluster_from_dict(section)
    with pytest.raises(ConfigError) as config_error:
        validate_config({"cluster": section})
    assert list(config_error.value.problems) == list(cluster_error.value.issues)
    (problem,) = config_error.value.problems
    assert (problem.rule, problem.location) == (
        "node_ranks.out_of_range",
        "cluster.node_groups[0].node_ranks",
    )


def test_schema_problems_are_named_by_rule_too():
    with pytest.raises(ConfigError) as caught:
        validate_config({"runner": {"iterations": 0, "nope": 1}})
    rules = {(problem.rule, problem.location) for problem in caught.value.problems}
    assert rules == {
        ("config.greater_than", "runner.iterations"),
        ("config.unknown_key", "runner.nope"),
    }
