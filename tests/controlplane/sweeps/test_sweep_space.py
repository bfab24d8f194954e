"""A sweep's space, objective and budget are checked against the trainer's schema, each
problem at its key path; what passes turns into Optuna's distributions, sampler and
pruner, and every trial Optuna asks for is a config the trainer takes."""

import optuna
import pytest

from controlplane.sweeps.space import check_sweep, overrides
from trainer.config.errors import ConfigError
from trainer.config.loading import apply_override, parse_yaml, validate_config

EXPERIMENT = parse_yaml(open("examples/builtin_ppo.yaml").read())
SPACE = {
    "actor.learning_rate": {"loguniform": [1e-4, 3e-3]},
    "algorithm.update_epochs": {"int": [2, 8]},
    "algorithm.clip_ratio": {"uniform": [0.1, 0.3]},
    "env.num_parallel_envs": {"choice": [8, 16]},
}


def sweep(**changes) -> dict:
    return {"space": SPACE, "objective": {"metric": "rollout/success_rate"},
            "budget": {"trials": 6, "parallel": 2}, **changes}  # fmt: skip


def problems(data: dict) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        check_sweep(EXPERIMENT, data)
    return [str(problem) for problem in caught.value.problems]


def test_every_trial_optuna_asks_for_is_a_config_the_trainer_takes():
    spec = check_sweep(EXPERIMENT, sweep())
    study = optuna.create_study(direction=spec.study_direction, sampler=spec.make_sampler(0),
                                pruner=spec.make_pruner())  # fmt: skip
    assert isinstance(study.pruner, optuna.pruners.MedianPruner)
    for _ in range(5):
        trial = study.ask(spec.distributions())
        data = dict(EXPERIMENT)
        for override in overrides(trial.params):
            apply_override(data, override)
        config = validate_config(data)
        assert 1e-4 <= config.actor.learning_rate <= 3e-3
        assert config.algorithm.update_epochs in range(2, 9)
        assert config.env.num_parallel_envs in (8, 16)
        study.tell(trial, config.actor.learning_rate)


def test_a_grid_walks_every_combination_of_int_ranges_and_choices():
    space = {
        "algorithm.update_epochs": {"int": [2, 4]},
        "env.num_parallel_envs": {"choice": [8, 16]},
    }
    spec = check_sweep(EXPERIMENT, sweep(space=space, sampler="grid"))
    study = optuna.create_study(sampler=spec.make_sampler(0))
    asked = set()

    def objective(trial: optuna.Trial) -> float:
        epochs = trial.suggest_int("algorithm.update_epochs", 2, 4)
        asked.add((epochs, trial.suggest_categorical("env.num_parallel_envs", [8, 16])))
        return 0.0

    study.optimize(objective, n_trials=20)  # the grid stops the study once walked
    assert len(study.trials) == 6
    assert asked == {(epochs, envs) for epochs in (2, 3, 4) for envs in (8, 16)}
    assert problems(sweep(sampler="grid")) == [
        "space.actor.learning_rate.loguniform: a grid takes int ranges and choices only",
        "space.algorithm.clip_ratio.uniform: a grid takes int ranges and choices only",
    ]


def test_bad_spaces_objectives_and_budgets_are_named_at_their_keys():
    bad = sweep(
        space={
            "actor.learnin_rate": {"uniform": [1e-4, 1e-3]},
            "actor.learning_rate": {"loguniform": [0, 1e-3]},
            "algorithm.update_epochs": {"int": [8, 2]},
            "env.num_parallel_envs": {"choice": [8, 0]},
            "algorithm.clip_ratio": {"uniform": [0.1, 0.3], "int": [1, 2]},
            "a..b": {"int": [1, 2]},
        },
        objective={"metric": "", "direction": "up"},
        budget={"trials": 2, "parallel": 3},
    )
    found = problems(bad)
    assert found[:6] == [
        "space.actor.learning_rate: loguniform: both bounds must be above 0",
        "space.algorithm.update_epochs: int: the low bound must be below the high one",
        "space.algorithm.clip_ratio: give exactly one of loguniform, uniform, int, choice "
        "(got ['uniform', 'int'])",
        "objective.metric: String should have at least 1 character",
        "objective.direction: Input should be 'max' or 'min'",
        "budget: parallel: 3 at once is more than 2 trials",
    ]
    # The schema's own checks, once the sweep's shape is right.
    shaped = ("actor.learnin_rate", "env.num_parallel_envs", "a..b")
    found = problems(sweep(space={key: bad["space"][key] for key in shaped}))
    assert found == [
        "space.actor.learnin_rate: unknown key; did you mean `actor.learning_rate`?",
        "space.env.num_parallel_envs.choice[1]: 0: env.num_parallel_envs: Input should be "
        "greater than 0",
        "space.a..b: is not a key path like a.b or a.b[1]",
    ]


def test_a_value_refused_beside_the_experiments_other_settings_is_named_at_its_key():
    """Chunks of 3 do not divide two of the example's horizons (5, 10, 15): the trainer
    names the horizons; the sweep names the key that would set it."""
    found = problems(sweep(space={"actor.model.num_action_chunks": {"int": [1, 3]}}))
    assert len(found) == 2 and all(
        line.startswith("space.actor.model.num_action_chunks.int[1]: 3: rollout.action_horizons")
        for line in found
    ), found
