import pytest

from trainer.config import (
    ConfigError,
    ExperimentConfig,
    apply_override,
    dump_config,
    load_config,
    parse_yaml,
    validate_config,
)

EXAMPLE = """
name: reach
env:
  num_parallel_envs: 8
  task_ids: [0, 1, 2]
actor:
  model:
    num_action_chunks: 5
rollout:
  action_horizons_pattern: [5, 10, 15]
algorithm:
  name: grpo
  group_size: 4
  data_batch_size: 32
  reward_filter: {enabled: true, max_attempts: 2}
cluster:
  num_nodes: 2
  component_placement:
    actor: 1:0
"""


def _write(tmp_path, text):
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    return path


def _problems(error):
    return [str(problem) for problem in error.value.problems]


def test_a_yaml_file_loads_into_typed_sections(tmp_path):
    config = load_config(_write(tmp_path, EXAMPLE))
    assert isinstance(config, ExperimentConfig)
    assert config.rollout.action_horizons_pattern == [5, 10, 15]
    assert config.algorithm.reward_filter.max_attempts == 2
    assert config.env.max_episode_steps == 40  # default kept
    # YAML 1.2: a placement is the text the user wrote, never the base-60 integer 60
    assert config.cluster["component_placement"]["actor"] == "1:0"


def test_overrides_take_key_paths_and_yaml_values(tmp_path):
    config = load_config(
        _write(tmp_path, EXAMPLE),
        [
            "algorithm.name=rloo",
            "rollout.action_horizons_pattern[1]=20",
            "algorithm.target_kl=0.02",
            "env.task_ids=[4, 5]",
            "runner.progress=false",
            "algorithm.value_clip=null",
        ],
    )
    assert config.algorithm.name == "rloo"
    assert config.rollout.action_horizons_pattern == [5, 20, 15]
    assert config.algorithm.target_kl == 0.02
    assert config.env.task_ids == [4, 5]
    assert config.runner.progress is False
    assert config.algorithm.value_clip is None


def test_errors_name_their_key_path(tmp_path):
    with pytest.raises(ConfigError) as error:
        load_config(_write(tmp_path, EXAMPLE), ["rollout.action_horizons_pattern[1]=12"])
    assert _problems(error) == [
        "rollout.action_horizons_pattern[1]: 12 must be a multiple of "
        "actor.model.num_action_chunks (5)"
    ]
    with pytest.raises(ConfigError) as error:
        load_config(
            None,
            [
                "algorithm.nmae=ppo",
                "env.num_parallel_envs=0",
                "algorithm.name=a2c",
                "actor.model.hidden_sizes=[]",
            ],
        )
    problems = _problems(error)
    assert "algorithm.nmae: unknown key; did you mean `algorithm.name`?" in problems
    assert "env.num_parallel_envs: Input should be greater than 0" in problems
    assert any(
        p.startswith("algorithm.name: Input should be 'ppo', 'grpo', 'rloo', 'rlpd' or 'bc'")
        for p in problems
    )
    assert any(p.startswith("actor.model.hidden_sizes: ") for p in problems)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["algorithm.name=grpo"], "algorithm.group_size: grpo compares rollouts"),
        (
            ["algorithm.group_size=4", "algorithm.data_batch_size=30"],
            "algorithm.data_batch_size: 30 must be a multiple of algorithm.group_size (4)",
        ),
        (
            ["algorithm.reward_filter.enabled=true"],
            "algorithm.reward_filter.enabled: the group filter needs",
        ),
        (["algorithm.use_plan_reward=true"], "algorithm.plan_reward_coef: use_plan_reward"),
        (
            ["algorithm.loss_aggregation=episodes"],
            "algorithm.loss_aggregation: episodes weighs an episode's shared outcome",
        ),
        (["env.task_ids=[1, 1]"], "env.task_ids[1]: 1 is negative or listed twice"),
        (["env.task_ids=[]"], "env.task_ids: lists no task"),
        (
            ["algorithm.name=rlpd", "actor.strategy=fsdp"],
            "actor.strategy: fsdp shards the model over actor ranks; RLPD's learner",
        ),
    ],
)
def test_rules_across_keys(overrides, expected):
    with pytest.raises(ConfigError) as error:
        load_config(None, overrides)
    assert _problems(error)[0].startswith(expected)


def test_the_mlp_activation_is_a_choice_with_a_cheap_default():
    assert validate_config({}).actor.model.activation == "silu"
    with pytest.raises(ConfigError, match="actor.model.activation"):
        validate_config({"actor": {"model": {"activation": "gelu"}}})


def test_bad_overrides_and_files_get_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="must look like key.path=value"):
        load_config(None, ["algorithm.name"])
    with pytest.raises(ConfigError, match=r"rollout.action_horizons_pattern\[7\]: no such list"):
        load_config(None, ["rollout.action_horizons_pattern[7]=5"])
    with pytest.raises(ConfigError, match="algorithm.name.x: cannot set a key inside"):
        load_config(None, ["algorithm.name=ppo", "algorithm.name.x=1"])
    with pytest.raises(ConfigError, match="not a key path"):
        load_config(None, ["algo-rithm.x=1"])
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "env: [unclosed"))
    with pytest.raises(ConfigError, match="must hold a mapping"):
        load_config(_write(tmp_path, "- a list"))
    with pytest.raises(ConfigError, match="must be a mapping of sections"):
        validate_config(["env"])


def test_the_resolved_config_round_trips_through_yaml(tmp_path):
    config = load_config(_write(tmp_path, EXAMPLE))
    again = validate_config(parse_yaml(dump_config(config)))
    assert again == config


def test_overrides_create_missing_sections():
    data: dict = {}
    apply_override(data, "cluster.component_placement.actor=0-3:0-7")
    apply_override(data, "rollout.action_horizons_pattern=[5]")
    apply_override(data, "rollout.action_horizons_pattern[1]=10")
    assert data == {
        "cluster": {"component_placement": {"actor": "0-3:0-7"}},
        "rollout": {"action_horizons_pattern": [5, 10]},
    }


def test_the_cluster_section_is_checked_by_trainer_cluster_with_key_paths():
    with pytest.raises(ConfigError) as caught:
        validate_config(
            {
                "cluster": {
                    "num_nodes": 2,
                    "node_groups": [{"label": "arm", "node_ranks": "0-5"}],
                    "component_placement": {"actor": "0-7"},
                }
            }
        )
    paths = [problem.location for problem in caught.value.problems]
    assert "cluster.node_groups[0].node_ranks" in paths
    assert all(path.startswith("cluster") for path in paths)


def test_a_placement_past_the_cluster_is_refused_with_its_key_path():
    with pytest.raises(ConfigError) as caught:
        validate_config({"cluster": {"num_nodes": 1, "component_placement": {"actor": "0-3"}}})
    assert caught.value.problems[0].location == "cluster.component_placement.actor"
    assert "resource rank 3 does not exist" in caught.value.problems[0].message


def test_cluster_and_schema_problems_come_together():
    with pytest.raises(ConfigError) as caught:
        validate_config({"runner": {"iterations": -1}, "cluster": {"num_nodes": "two"}})
    paths = {problem.location for problem in caught.value.problems}
    assert {"runner.iterations", "cluster.num_nodes"} <= paths


@pytest.mark.parametrize("number", [".nan", ".inf", "-.inf", "1e400"])
def test_nan_and_infinity_are_not_numbers_a_setting_accepts(number):
    with pytest.raises(ConfigError) as caught:
        validate_config(parse_yaml(f"actor:\n  learning_rate: {number}\n"))
    assert caught.value.problems[0].location == "actor.learning_rate"
    assert "finite" in caught.value.problems[0].message


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("runner.iteratons=5", "runner.iteratons: unknown key; did you mean `runner.iterations`?"),
        ("actor.model.lora.rnk=4",
         "actor.model.lora.rnk: unknown key; did you mean `actor.model.lora.rank`?"),
        ("env.real_robot.robots=[{url: 'http://arm:5000', safty_box: {}}]",
         "env.real_robot.robots[0].safty_box: unknown key; did you mean "
         "`env.real_robot.robots[0].safety_box`?"),
        ("runner.zzz=1", "runner.zzz: unknown key"),  # nothing near: no guess
        ("zzz.q=1", "zzz: unknown key"),
    ],
)  # fmt: skip
def test_an_unknown_key_names_the_closest_key_of_its_section(override, said):
    with pytest.raises(ConfigError) as error:
        load_config("examples/builtin_ppo.yaml", [override])
    assert said in _problems(error)
