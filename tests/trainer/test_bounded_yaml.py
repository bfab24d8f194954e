"""The one bounded YAML reader: every limit refuses with its name and the line, real
documents (aliases and merge keys included) still read, and every trainer entry point
(cluster files, placements, experiment configs, CLI overrides) goes through it."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.hostile_yaml import ALIAS_BOMB, DEEP_NESTING
from trainer import cluster as tc
from trainer.bounded_yaml import YamlLimitError, YamlLimits, load_bounded
from trainer.config import ConfigError, apply_override, load_config, parse_yaml

# Hang guard: before the limits, these documents kept a thread busy for minutes.
pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("typ", ["safe", "rt"])
def test_it_refuses_the_600_byte_alias_bomb_naming_the_limit_and_line(typ):
    assert len(ALIAS_BOMB.encode()) == 600
    with pytest.raises(YamlLimitError) as caught:
        load_bounded(ALIAS_BOMB, typ)
    assert caught.value.limit == "max_nodes"
    assert "ARMATURE_YAML_MAX_NODES" in str(caught.value)
    assert caught.value.problem_mark.line + 1 == 6  # l5 is the first level past 100,000


@pytest.mark.parametrize("typ", ["safe", "rt"])
def test_it_refuses_deep_nesting(typ):
    with pytest.raises(YamlLimitError) as caught:
        load_bounded(DEEP_NESTING, typ)
    assert caught.value.limit == "max_depth"
    assert "deeper than 64 levels" in caught.value.problem
    # refused at the 65th bracket, before the scanner looks further ahead
    assert caught.value.problem_mark.column == len("cluster: ") + 64


def test_it_refuses_deep_block_nesting():
    text = "".join(f"{' ' * level}k{level}:\n" for level in range(100)) + " " * 100 + "x\n"
    with pytest.raises(YamlLimitError) as caught:
        load_bounded(text)
    assert caught.value.limit == "max_depth"
    assert caught.value.problem_mark.line + 1 == 64  # the mapping of k63, the 65th level


def test_depth_counts_what_an_alias_brings_in():
    text = "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n"
    with pytest.raises(YamlLimitError) as caught:
        load_bounded(text)
    assert caught.value.limit == "max_depth"
    assert caught.value.problem_mark.line + 1 == 2


def test_it_refuses_too_many_aliases_even_of_a_scalar():
    text = "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n"
    with pytest.raises(YamlLimitError) as caught:
        load_bounded(text)
    assert caught.value.limit == "max_aliases"


def test_the_size_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ARMATURE_YAML_MAX_BYTES", "100")
    assert load_bounded("a: " + "x" * 90) == {"a": "x" * 90}
    with pytest.raises(YamlLimitError) as caught:
        load_bounded("a: " + "x" * 100)
    assert caught.value.limit == "max_bytes"
    assert "103 bytes, over the limit of 100 bytes (ARMATURE_YAML_MAX_BYTES)" in str(caught.value)


def test_a_bad_limit_setting_is_named(monkeypatch):
    monkeypatch.setenv("ARMATURE_YAML_MAX_DEPTH", "deep")
    with pytest.raises(ValueError, match="ARMATURE_YAML_MAX_DEPTH='deep' is not a whole number"):
        YamlLimits.from_env()


def test_an_integer_too_long_to_convert_is_refused_not_crashed():
    with pytest.raises(YamlLimitError) as caught:
        load_bounded("a: 1" + "0" * 5000)
    assert caught.value.limit == "value"


@pytest.mark.parametrize("typ", ["safe", "rt"])
def test_ordinary_aliases_and_merge_keys_still_read(typ):
    text = "base: &base {lr: 0.001, clip: 0.2}\nppo:\n  <<: *base\n  clip: 0.1\nother: *base\n"
    data = load_bounded(text, typ)
    assert dict(data["ppo"]) == {"lr": 0.001, "clip": 0.1}
    assert dict(data["other"]) == {"lr": 0.001, "clip": 0.2}


@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 9), levels=st.integers(1, 12))
def test_an_alias_tree_reads_exactly_when_its_expansion_fits(width, levels):
    """Level k repeats level k-1 `width` times; expanded, the last level has
    width**levels leaves. It reads when everything fits in 2,000 nodes, else is refused."""
    lines = ["l0: &l0 x"]
    for level in range(1, levels + 1):
        lines.append(f"l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * width) + "]")
    text = "\n".join(lines) + "\n"
    # nodes: the root, each key, each level expanded (1 + width * previous)
    sizes = [1]
    for _ in range(levels):
        sizes.append(1 + width * sizes[-1])
    total = 1 + (levels + 1) + sum(sizes)
    limits = YamlLimits(max_nodes=2_000, max_aliases=10_000, max_depth=64)
    if total <= limits.max_nodes and levels + 2 <= limits.max_depth:
        data = load_bounded(text, limits=limits)
        assert len(data) == levels + 1
    else:
        with pytest.raises(YamlLimitError):
            load_bounded(text, limits=limits)


def test_cluster_yaml_reports_the_bomb_as_one_issue_with_its_line():
    with pytest.raises(tc.ClusterConfigError) as caught:
        tc.load_cluster_yaml(ALIAS_BOMB)
    (issue,) = caught.value.issues
    assert issue.rule == "yaml.limit"
    assert issue.line == 6
    assert "expands to more than 100000 nodes" in issue.message


def test_a_placement_text_is_bounded_too():
    spec = tc.load_cluster_yaml("cluster:\n  num_nodes: 1\n")
    with pytest.raises(tc.ClusterConfigError) as caught:
        tc.resolve_placement_text(spec, "component_placement:\n  actor: " + DEEP_NESTING[9:])
    assert caught.value.issues[0].rule == "yaml.limit"


def test_experiment_configs_from_files_and_overrides_are_bounded(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    with pytest.raises(ConfigError, match=r"is refused: the document expands to more than"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"nests deeper than 64 levels"):
        apply_override({}, "env.task_ids=" + "[" * 100 + "]" * 100)
    with pytest.raises(ConfigError, match=r"line 1, column"):
        parse_yaml(DEEP_NESTING)


@pytest.mark.parametrize(("escape", "says"), [("\\0", "a NUL"), ("\\ud800", "an unpaired")])
def test_strings_that_cannot_be_stored_are_refused_with_their_line(escape, says):
    with pytest.raises(YamlLimitError) as caught:
        load_bounded(f'a: ok\nb: "x{escape}"\n')
    assert caught.value.limit == "characters"
    assert caught.value.problem.startswith(f"a string holds {says}")
    assert caught.value.problem_mark.line + 1 == 2
    assert load_bounded('a: "把手 🤖"') == {"a": "把手 🤖"}
