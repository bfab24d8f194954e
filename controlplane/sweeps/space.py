"""What a sweep searches: its space (settings by key path, each a range or a choice),
its objective (a metric, a direction, averaged over the last points) and its budget,
checked against the trainer's own schema, and turned into what Optuna takes.

A sweep is written as YAML, e.g.::

    space:
      actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
      algorithm.clip_ratio: {uniform: [0.1, 0.3]}
      algorithm.update_epochs: {int: [2, 8]}
      actor.model.temperature: {choice: [0.5, 1.0, 1.6]}
    objective: {metric: rollout/success_rate, direction: max, last: 3}
    # or: {metric: eval/success_rate, evaluate: {suite: libero_10, states: 5}}
    budget: {trials: 8, parallel: 2, wall_time_min: 60}
    sampler: tpe      # or random, grid
    pruner: median    # or halving, none

Every value a trial can be given is checked as the experiment would take it (both
bounds of a range, every choice): a key the schema does not know, or a value it refuses
(alone or beside the experiment's other settings), is a problem at that key of the
space, with the trainer's own words.
"""

from __future__ import annotations

import builtins
import copy
import json
from typing import Any, Literal

import optuna
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, ValidationError, model_validator

from controlplane.runs.models import EVAL_SUCCESS_KEY
from trainer.config.errors import ConfigError, ConfigIssue
from trainer.config.loading import apply_override, validate_config

RULE = "sweep.invalid"
# An eval run's suite average: as an objective, each trial's last checkpoint is evaluated.
EVAL_METRIC = EVAL_SUCCESS_KEY
KINDS = ("loguniform", "uniform", "int", "choice")
MAX_TRIALS = 1000
MAX_CHOICES = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Dimension(_Strict):
    """One setting's range or choices: exactly one of the kinds."""

    loguniform: tuple[float, float] | None = None
    uniform: tuple[float, float] | None = None
    # The YAML's word; `builtins.int` below, as the field's name hides the type here.
    int: tuple[builtins.int, builtins.int] | None = None
    choice: list[bool | builtins.int | float | str] | None = Field(
        None, min_length=1, max_length=MAX_CHOICES
    )

    @model_validator(mode="after")
    def _one_kind(self) -> Dimension:
        given = [kind for kind in KINDS if getattr(self, kind) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of {', '.join(KINDS)} (got {given or 'none'})")
        low_high = self.loguniform or self.uniform or self.int
        if low_high is not None and not low_high[0] < low_high[1]:
            raise ValueError(f"{self.kind}: the low bound must be below the high one")
        if self.loguniform is not None and self.loguniform[0] <= 0:
            raise ValueError("loguniform: both bounds must be above 0")
        if self.choice is not None and len({json.dumps(c) for c in self.choice}) < len(self.choice):
            raise ValueError("choice: each value once")
        return self

    @property
    def kind(self) -> str:
        return next(kind for kind in KINDS if getattr(self, kind) is not None)

    def values_to_check(self) -> list[Any]:
        """The values a trial can be given that the schema must accept: a range's bounds,
        every choice."""
        return list(self.choice if self.choice is not None else getattr(self, self.kind))

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.loguniform is not None:
            return optuna.distributions.FloatDistribution(*self.loguniform, log=True)
        if self.uniform is not None:
            return optuna.distributions.FloatDistribution(*self.uniform)
        if self.int is not None:
            return optuna.distributions.IntDistribution(*self.int)
        return optuna.distributions.CategoricalDistribution(self.choice)

    def grid(self) -> list[Any] | None:
        """Every value, for a grid; None for a float range (no grid of its own)."""
        if self.choice is not None:
            return list(self.choice)
        if self.int is not None:
            return list(range(self.int[0], self.int[1] + 1))
        return None


class Evaluation(_Strict):
    """The evaluation each trial's last checkpoint gets, whose suite average is the
    trial's objective (the Evaluate form's choices; none: the run's own suite and tasks,
    every init state)."""

    suite: str | None = Field(None, max_length=100)
    states: PositiveInt | None = None


class Objective(_Strict):
    metric: str = Field(min_length=1, max_length=200)
    direction: Literal["max", "min"] = "max"
    last: PositiveInt = Field(
        3, le=1000, description="Points of the metric averaged (the run's last ones)."
    )
    evaluate: Evaluation | None = None

    @model_validator(mode="after")
    def _evaluated(self) -> Objective:
        if self.evaluate is not None and self.metric != EVAL_METRIC:
            raise ValueError(f"evaluate: an evaluation's objective is {EVAL_METRIC}")
        return self

    @property
    def by_evaluation(self) -> bool:
        """The suite average of an evaluation of each trial's last checkpoint (an eval run
        launched once the trial's run has succeeded), rather than the run's own points."""
        return self.metric == EVAL_METRIC


class Budget(_Strict):
    trials: PositiveInt = Field(le=MAX_TRIALS)
    parallel: PositiveInt = 1
    wall_time_min: float | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _parallel_within_trials(self) -> Budget:
        if self.parallel > self.trials:
            raise ValueError(f"parallel: {self.parallel} at once is more than {self.trials} trials")
        return self


class SweepSpec(_Strict):
    space: dict[str, Dimension] = Field(min_length=1, max_length=32)
    objective: Objective
    budget: Budget
    sampler: Literal["tpe", "random", "grid"] = "tpe"
    pruner: Literal["median", "halving", "none"] = "median"

    def distributions(self) -> dict[str, optuna.distributions.BaseDistribution]:
        return {key: dimension.distribution() for key, dimension in self.space.items()}

    def make_sampler(self, seed: int | None = None) -> optuna.samplers.BaseSampler:
        if self.sampler == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if self.sampler == "grid":
            grid = {key: dimension.grid() for key, dimension in self.space.items()}
            return optuna.samplers.GridSampler(grid, seed=seed)
        return optuna.samplers.TPESampler(seed=seed)

    def make_pruner(self) -> optuna.pruners.BasePruner:
        if self.pruner == "median":
            return optuna.pruners.MedianPruner(n_startup_trials=2)
        if self.pruner == "halving":
            return optuna.pruners.SuccessiveHalvingPruner()
        return optuna.pruners.NopPruner()

    @property
    def study_direction(self) -> str:
        return "maximize" if self.objective.direction == "max" else "minimize"


def overrides(params: dict[str, Any]) -> list[str]:
    """A trial's parameters as the overrides its run is launched with (JSON values read
    back as themselves in YAML)."""
    return [f"{key}={json.dumps(value)}" for key, value in params.items()]


def check_sweep(experiment: dict[str, Any], data: Any) -> SweepSpec:
    """The sweep `data` over the experiment config `experiment` (its parsed YAML); raises
    `ConfigError` with every problem at its key path (``space.<key>.<kind>[i]``)."""
    try:
        spec = SweepSpec.model_validate(data)
    except ValidationError as error:
        raise ConfigError([_issue(tuple(e["loc"]), e["msg"]) for e in error.errors()]) from None
    already = {str(problem) for problem in _problems(experiment)}  # the experiment's own
    problems = []
    for key, dimension in spec.space.items():
        seen = set(already)  # a key the schema does not know: said once, not per value
        for index, value in enumerate(dimension.values_to_check()):
            data = copy.deepcopy(experiment)
            try:
                apply_override(data, f"{key}={json.dumps(value)}")
            except ConfigError as error:
                problems += [_issue(("space", key), p.message) for p in error.problems]
                break
            for problem in _problems(data):
                if str(problem) in seen:
                    continue
                seen.add(str(problem))
                if problem.rule == "config.unknown_key" and problem.location == key:
                    problems.append(_issue(("space", key), problem.message))
                    break
                where = ("space", key, dimension.kind, index)
                problems.append(_issue(where, f"{value!r}: {problem}"))
    if spec.sampler == "grid":
        problems += [
            _issue(("space", key, dim.kind), "a grid takes int ranges and choices only")
            for key, dim in spec.space.items() if dim.grid() is None
        ]  # fmt: skip
    if problems:
        raise ConfigError(problems)
    return spec


def _problems(data: dict[str, Any]) -> list[ConfigIssue]:
    try:
        validate_config(data)
    except ConfigError as error:
        return error.problems
    return []


def _issue(path: tuple, message: str) -> ConfigIssue:
    return ConfigIssue(RULE, message.removeprefix("Value error, "), path)
