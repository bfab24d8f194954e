"""Eval runs: a run that evaluates a checkpoint of another run (its source) with
`python -m trainer eval`, through the same lifecycle and submission as a training run
(docs/runs.md#evaluations). What a request may ask, checked against the source run's
frozen config and its checkpoints; the run it creates; its Ray job's command."""

from __future__ import annotations

from dataclasses import dataclass

from controlplane.runs import artifacts
from controlplane.runs.launch import queue_run, run_with_key
from controlplane.runs.models import Run, RunKind
from trainer.config.env_defaults import (
    LIBERO_SUITE_TASKS,
    env_init_states_per_task,
    env_task_count,
)
from trainer.config.errors import ConfigError
from trainer.config.loading import parse_yaml, validate_config
from trainer.config.schema import ExperimentConfig

FIELDS = ("checkpoint", "suite", "tasks", "states")


@dataclass(frozen=True)
class EvalRequest:
    """What to evaluate; None everywhere means the latest checkpoint, the run's suite and
    tasks, and every init state of each task (a suite named here: all its tasks)."""

    checkpoint: int | None = None
    suite: str | None = None
    tasks: list[int] | None = None
    states: int | None = None


class EvaluationRefused(ValueError):
    """A request that cannot be run: {field: what is wrong}, every problem at once
    (`run` when the source run itself cannot be evaluated)."""

    def __init__(self, problems: dict[str, str]):
        super().__init__("; ".join(f"{field}: {text}" for field, text in problems.items()))
        self.problems = problems


@dataclass(frozen=True)
class EvalChoices:
    """What an evaluation of `source` may ask for, for the Evaluate form."""

    checkpoints: list[int]  # iterations, newest first
    env: str
    suite: str | None
    suites: list[str]  # the suites its policy can be evaluated on (LIBERO)
    task_count: int | None  # None: only the env knows
    tasks: list[int] | None  # the run's own tasks (None: every task)
    states: int | None  # init states per task (None: only the env knows)


def evaluation_choices(source: Run) -> EvalChoices | None:
    """None for a run that cannot be evaluated (an eval run, or a config that no longer
    validates); the form then offers nothing."""
    if source.is_eval:
        return None
    try:
        config = _config_of(source)
    except ConfigError:
        return None
    env = config.env
    suites = []
    if env.name == "libero":
        own = LIBERO_SUITE_TASKS.get(env.suite or "")
        suites = [s for s, n in LIBERO_SUITE_TASKS.items() if env.camera or n == own]
    return EvalChoices(
        checkpoints=sorted(artifacts.checkpoints(source.pk), reverse=True),
        env=env.name,
        suite=env.suite,
        suites=suites,
        task_count=env_task_count(env.name, env.suite),
        tasks=list(env.task_ids) if env.task_ids else None,
        states=env_init_states_per_task(env.name, env.init_states_per_task),
    )


def check_request(source: Run, request: EvalRequest) -> tuple[int, dict, int | None]:
    """The checkpoint iteration, the options stored on the eval run and its task count
    (None when unknown); raises EvaluationRefused naming every field that is wrong."""
    if source.is_eval:
        raise EvaluationRefused({
            "run": f"run {source.pk} is an evaluation; evaluate a training run "
            f"(run {source.source_run_id} is the one it evaluates)"
        })  # fmt: skip
    try:
        config = _config_of(source)
    except ConfigError as error:
        problem = f"run {source.pk}'s config does not validate: {error}"
        raise EvaluationRefused({"run": problem}) from None
    problems: dict[str, str] = {}
    iteration = _checkpoint(source, request.checkpoint, problems)
    suite = _suite(config, request.suite, problems)
    count = env_task_count(config.env.name, suite or config.env.suite)
    tasks = _tasks(config, request.tasks, count, problems)
    _states(config, request.states, problems)
    if problems:
        raise EvaluationRefused(problems)
    options = {"suite": request.suite, "tasks": request.tasks, "states": request.states}
    own_tasks = None if request.suite else config.env.task_ids  # a named suite: all of it
    task_count = len(tasks) if tasks else len(own_tasks) if own_tasks else count
    return iteration, options, task_count


def request_evaluation(
    source: Run,
    request: EvalRequest,
    *,
    user,
    idempotency_key: str | None = None,
    timeout_s: int | None = None,
) -> tuple[Run, bool]:
    """Queue an eval run of `source`'s checkpoint: (run, created). With an idempotency
    key this user already used, the run it made comes back and nothing new starts.
    Raises EvaluationRefused."""
    existing = run_with_key(user, idempotency_key)
    if existing is not None:
        return existing, False
    iteration, options, task_count = check_request(source, request)
    return queue_run(
        user, idempotency_key, f"by {user}: evaluates run {source.pk} at iteration {iteration}",
        kind=RunKind.EVAL, source_run=source, source_iteration=iteration, eval_options=options,
        experiment=source.experiment, revision=source.revision, cluster=None,
        config_yaml=source.config_yaml, timeout_s=timeout_s, tags=list(source.tags),
        progress_total=task_count or 0,
    )  # fmt: skip


def eval_arguments(run: Run) -> list[str]:
    """`python -m trainer` arguments of an eval run's job: the source run's checkpoint,
    evaluated with the source run's frozen config (the job folder's `config.yaml`, the
    eval run's own copy of it) and written by the trainer into the eval run's own
    folder."""
    checkpoint = artifacts.checkpoint_path(run.source_run_id, run.source_iteration)
    output = artifacts.run_artifact_dir(run.pk)
    arguments = ["eval", str(checkpoint.resolve()), "--config", "config.yaml",
                 "--output", str(output.resolve())]  # fmt: skip
    options = run.eval_options or {}
    if options.get("suite"):
        arguments += ["--suite", options["suite"]]
    if options.get("tasks"):
        arguments += ["--tasks", ",".join(map(str, options["tasks"]))]
    if options.get("states"):
        arguments += ["--states", str(options["states"])]
    return arguments


def _config_of(run: Run) -> ExperimentConfig:
    return validate_config(parse_yaml(run.config_yaml))


def _checkpoint(source: Run, asked: int | None, problems: dict[str, str]) -> int:
    have = artifacts.checkpoints(source.pk)
    if not have:
        problems["checkpoint"] = (
            f"run {source.pk} has no checkpoint yet (a run saves one every "
            "runner.checkpoint_every iterations and at its end)"
        )
        return 0
    if asked is None:
        return max(have)
    if asked not in have:
        shown = ", ".join(map(str, have))
        problems["checkpoint"] = f"run {source.pk} has no checkpoint of iteration {asked}; " + (
            f"it has {shown}"
        )
    return asked


def _suite(config: ExperimentConfig, asked: str | None, problems: dict[str, str]) -> str | None:
    if asked is None:
        return None
    env = config.env
    if env.name != "libero":
        problems["suite"] = f"{env.name} has no suites; leave suite out"
    elif asked not in LIBERO_SUITE_TASKS:
        problems["suite"] = (
            f"unknown LIBERO suite {asked!r}; use one of {', '.join(LIBERO_SUITE_TASKS)}"
        )
    elif not env.camera and LIBERO_SUITE_TASKS[asked] != LIBERO_SUITE_TASKS.get(env.suite or ""):
        problems["suite"] = (
            f"{asked} has {LIBERO_SUITE_TASKS[asked]} tasks; the policy was trained on "
            f"{env.suite}'s {LIBERO_SUITE_TASKS.get(env.suite or '')} (its observation holds "
            "the task as a one-hot of that size)"
        )
    return asked


def _tasks(
    config: ExperimentConfig, asked: list[int] | None, count: int | None, problems: dict
) -> list[int] | None:
    if asked is None:
        return None
    if not asked:
        problems["tasks"] = "lists no task; leave it out to evaluate the run's own tasks"
        return None
    negative = [task for task in asked if task < 0]
    twice = sorted({task for task in asked if asked.count(task) > 1})
    unknown = [task for task in asked if count is not None and task >= count]
    if negative:
        problems["tasks"] = f"not task ids: {', '.join(map(str, negative))}"
    elif twice:
        problems["tasks"] = f"listed twice: {', '.join(map(str, twice))}"
    elif unknown:
        problems["tasks"] = (
            f"{config.env.name} has tasks 0..{count - 1}; not {', '.join(map(str, unknown))}"
        )
    return asked


def _states(config: ExperimentConfig, asked: int | None, problems: dict[str, str]) -> None:
    if asked is None:
        return
    available = env_init_states_per_task(config.env.name, config.env.init_states_per_task)
    if asked < 1:
        problems["states"] = f"must be at least 1, not {asked}"
    elif available is not None and asked > available:
        problems["states"] = (
            f"{config.env.name} has {available} init states per task; at most {available}"
        )
