"""A sweep's steps over real runs in the project's database and Optuna's study beside it:
trials launch through the ordinary launch path up to the budget's parallel count, each
once; a run's points are its trial's intermediate values, its end the trial's; pruned
and cancelled trials stop through the run's cancel; a step cut short anywhere is
finished by the next without a second run; the best trial becomes a revision."""

import optuna
import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.experiments.services import create_experiment
from controlplane.inventory.services import import_cluster_yaml
from controlplane.runs import artifacts, metric_points
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from controlplane.sweeps.models import SweepState, TrialState
from controlplane.sweeps.progress import advance
from controlplane.sweeps.services import (
    best_trial,
    cancel_sweep,
    create_sweep,
    importances,
    revision_from_best,
)
from controlplane.sweeps.storage import load_study
from trainer.config.errors import ConfigError

# Optuna writes through connections of its own: what the test stores must be committed.
pytestmark = pytest.mark.django_db(transaction=True)

EXPERIMENT = open("examples/builtin_ppo.yaml").read()
SPEC = """
space:
  actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
  algorithm.clip_ratio: {uniform: [0.1, 0.3]}
objective: {metric: rollout/success_rate, direction: max, last: 2}
budget: {trials: 3, parallel: 2}
sampler: random
pruner: none
"""


@pytest.fixture
def user():
    user = get_user_model().objects.create_user("sam", password="pw-for-tests")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    return user


@pytest.fixture
def experiment(user):
    return create_experiment("searched", "# tuned by hand\n" + EXPERIMENT, author=user)


def train(run: Run, values: list[float], end: RunState | None = RunState.SUCCEEDED) -> None:
    """What a trainer does to its run: it starts, logs `values` at steps 1, 2, …, ends."""
    if run.state == RunState.QUEUED:
        transition(run.pk, RunState.SUBMITTING)
        transition(run.pk, RunState.RUNNING)
    for step, value in enumerate(values, start=1):
        metric_points.store_points(run.pk, step, 1.7e9 + step, {"rollout/success_rate": value})
    if end is not None:
        transition(run.pk, end, "" if end == RunState.SUCCEEDED else "it broke")


def trials(sweep):
    return list(sweep.trials.select_related("run").order_by("number"))


def test_trials_launch_up_to_the_parallel_count_once_each_and_end_with_their_runs(experiment, user):
    sweep, _ = create_sweep(experiment, SPEC, user=user)
    advance(sweep.pk)
    advance(sweep.pk)  # a second step launches nothing more: two run at once
    first, second = trials(sweep)
    assert Run.objects.count() == 2
    for trial in (first, second):
        run = trial.run
        assert run.state == RunState.QUEUED and run.created_by == user
        assert run.tags[-1] == f"sweep-{sweep.pk}"
        assert run.overrides == [f"{k}={v!r}".replace("'", '"') for k, v in trial.params.items()]
        assert run.config["actor"]["learning_rate"] == pytest.approx(
            trial.params["actor.learning_rate"]
        )
        assert 1e-4 <= trial.params["actor.learning_rate"] <= 3e-3

    train(first.run, [0.2, 0.4, 0.6])
    advance(sweep.pk)
    first, second, third = trials(sweep)
    assert first.state == TrialState.COMPLETE and first.value == pytest.approx(0.5)  # last 2
    assert third.run is not None and Run.objects.count() == 3

    train(second.run, [0.1], end=RunState.FAILED)  # a failed run: a failed trial, not retried
    train(third.run, [0.9, 0.7])
    advance(sweep.pk)
    sweep.refresh_from_db()
    first, second, third = trials(sweep)
    assert second.state == TrialState.FAILED and "it broke" in second.reason
    assert third.state == TrialState.COMPLETE and third.value == pytest.approx(0.8)
    assert sweep.state == SweepState.FINISHED and Run.objects.count() == 3
    assert best_trial(sweep) == third

    study = load_study(sweep)  # Optuna's record says the same
    told = {t.number: (t.state, t.value) for t in study.trials}
    assert told == {
        first.number: (optuna.trial.TrialState.COMPLETE, pytest.approx(0.5)),
        second.number: (optuna.trial.TrialState.FAIL, None),
        third.number: (optuna.trial.TrialState.COMPLETE, pytest.approx(0.8)),
    }
    assert set(importances(sweep)) == {"actor.learning_rate", "algorithm.clip_ratio"}


def test_a_step_cut_short_anywhere_is_finished_without_a_second_run(experiment, user):
    sweep, _ = create_sweep(experiment, SPEC.replace("parallel: 2", "parallel: 1"), user=user)
    # Cut short after Optuna was asked, before the trial's row: the next step takes it up.
    asked = load_study(sweep).ask(
        {"actor.learning_rate": optuna.distributions.FloatDistribution(1e-4, 3e-3, log=True),
         "algorithm.clip_ratio": optuna.distributions.FloatDistribution(0.1, 0.3)}
    )  # fmt: skip
    advance(sweep.pk)
    (trial,) = trials(sweep)
    assert trial.number == asked.number and trial.params == asked.params
    # Cut short after the run's launch, before the trial pointed at it: the same run.
    run = trial.run
    trial.run = None
    trial.save()
    advance(sweep.pk)
    (trial,) = trials(sweep)
    assert trial.run == run and Run.objects.count() == 1
    # Cut short after Optuna was told, before the row said so: told once, stored once.
    train(run, [0.3, 0.5])
    load_study(sweep).tell(trial.number, 0.4)
    advance(sweep.pk)
    (first, second) = trials(sweep)
    assert first.state == TrialState.COMPLETE and first.value == pytest.approx(0.4)
    assert Run.objects.count() == 2
    # A step that another holds is not taken twice at once.
    sweep.refresh_from_db()
    type(sweep).objects.filter(pk=sweep.pk).update(lease_until="2999-01-01T00:00:00Z")
    advance(sweep.pk)
    train(second.run, [0.1, 0.1])
    advance(sweep.pk)
    assert trials(sweep)[1].state == TrialState.RUNNING  # the holder has not let go


def test_a_trial_behind_the_others_is_pruned_through_its_runs_cancel(experiment, user):
    spec = SPEC.replace("pruner: none", "pruner: median").replace("trials: 3", "trials: 4")
    sweep, _ = create_sweep(experiment, spec.replace("parallel: 2", "parallel: 1"), user=user)
    for values in ([0.6, 0.7, 0.8, 0.9], [0.5, 0.7, 0.8, 0.8]):  # the pruner's startup trials
        advance(sweep.pk)
        train(trials(sweep)[-1].run, values)
    advance(sweep.pk)
    third = trials(sweep)[-1]
    train(third.run, [0.0, 0.0], end=None)  # far behind at the same steps
    advance(sweep.pk)
    third = trials(sweep)[2]
    third.run.refresh_from_db()
    assert third.state == TrialState.PRUNED and third.reported_step == 2
    assert third.run.cancel_requested_at is not None
    assert "pruned by sweep" in third.run.events.get(kind="cancel_requested").message
    # Its run still ends (it checkpoints first): until then it holds the one place.
    advance(sweep.pk)
    assert len(trials(sweep)) == 3
    transition(third.run.pk, RunState.CANCELLED)
    advance(sweep.pk)
    assert len(trials(sweep)) == 4
    frozen = {t.number: t.state for t in load_study(sweep).trials}
    assert frozen[third.number] == optuna.trial.TrialState.PRUNED


def test_cancelling_a_sweep_stops_its_running_trials_and_ends_when_their_runs_have(
    experiment, user
):
    sweep, _ = create_sweep(experiment, SPEC, user=user)
    advance(sweep.pk)
    first, second = trials(sweep)
    train(first.run, [0.4], end=None)
    cancel_sweep(sweep)
    advance(sweep.pk)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.RUNNING  # first's run has yet to stop
    first, second = trials(sweep)
    assert {first.state, second.state} == {TrialState.CANCELLED}
    assert first.run.cancel_requested_at is not None
    second.run.refresh_from_db()
    assert second.run.state == RunState.CANCELLED  # queued: cancelled at once
    transition(first.run.pk, RunState.CANCELLED)
    advance(sweep.pk)
    sweep.refresh_from_db()
    assert sweep.state == SweepState.CANCELLED and Run.objects.count() == 2


def test_an_interrupted_trial_run_is_resumed_and_goes_on(experiment, user):
    sweep, _ = create_sweep(experiment, SPEC.replace("parallel: 2", "parallel: 1"), user=user)
    advance(sweep.pk)
    (trial,) = trials(sweep)
    train(trial.run, [0.2], end=RunState.INTERRUPTED)
    advance(sweep.pk)
    trial.run.refresh_from_db()
    assert trial.run.state == RunState.QUEUED and trial.run.attempt == 2
    assert len(trials(sweep)) == 1


def test_a_sweep_refused_at_its_keys_and_the_best_trial_becomes_a_revision(experiment, user):
    with pytest.raises(ConfigError) as refused:
        create_sweep(experiment, SPEC.replace("algorithm.clip_ratio", "algorithm.nope"),
                     user=user)  # fmt: skip
    assert "space.algorithm.nope" in str(refused.value)
    one = SPEC.replace("trials: 3", "trials: 1").replace("parallel: 2", "parallel: 1")
    sweep, _ = create_sweep(experiment, one, user=user)
    with pytest.raises(ConfigError, match="no trial has completed"):
        revision_from_best(sweep, user)
    advance(sweep.pk)
    (trial,) = trials(sweep)
    train(trial.run, [0.5, 0.5])
    advance(sweep.pk)
    revision = revision_from_best(sweep, user)
    assert revision.number == 2 and f"best trial {trial.number} of sweep" in revision.message
    assert revision.config_yaml.startswith("# tuned by hand\n")  # its comments kept
    assert f"learning_rate: {trial.params['actor.learning_rate']}" in revision.config_yaml


def test_trials_that_hold_the_same_devices_run_one_at_a_time(experiment, user):
    """Placed on a cluster's GPUs (and an arm), every trial's run would hold the same
    devices: more than one at once is refused at budget.parallel."""
    cluster = import_cluster_yaml("lab", open("examples/clusters/two_nodes.yaml").read())
    with pytest.raises(ConfigError) as refused:
        create_sweep(experiment, SPEC, user=user, cluster=cluster)
    (problem,) = refused.value.problems
    assert problem.location == "budget.parallel"
    assert "accelerator 0 of node 0, accelerator 1 of node 0" in problem.message
    sweep, _ = create_sweep(experiment, SPEC.replace("parallel: 2", "parallel: 1"), user=user,
                            cluster=cluster)  # fmt: skip
    advance(sweep.pk)
    (trial,) = trials(sweep)
    assert trial.run.cluster == cluster


def test_an_evaluations_objective_evaluates_each_trials_last_checkpoint(experiment, user):
    spec = SPEC.replace("{metric: rollout/success_rate, direction: max, last: 2}",
                        "{metric: eval/success_rate, evaluate: {states: 2}}")  # fmt: skip
    sweep, _ = create_sweep(experiment, spec.replace("parallel: 2", "parallel: 1"), user=user)
    advance(sweep.pk)
    (trial,) = trials(sweep)
    checkpoint = artifacts.checkpoint_path(trial.run.pk, 60)
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    checkpoint.write_bytes(b"weights")
    train(trial.run, [0.2, 0.4])
    advance(sweep.pk)
    (trial,) = trials(sweep)
    evaluation = trial.eval_run
    assert trial.state == TrialState.RUNNING and evaluation.is_eval
    assert evaluation.source_run == trial.run and evaluation.source_iteration == 60
    assert evaluation.eval_options["states"] == 2
    advance(sweep.pk)  # asked once, whatever the steps
    assert Run.objects.filter(kind="eval").count() == 1 and len(trials(sweep)) == 1
    transition(evaluation.pk, RunState.SUBMITTING)
    transition(evaluation.pk, RunState.SUCCEEDED, summary={"eval/success_rate": 0.85})
    advance(sweep.pk)
    first = trials(sweep)[0]
    assert first.state == TrialState.COMPLETE and first.value == pytest.approx(0.85)
    # A run without a checkpoint cannot be evaluated: a failed trial, said why.
    second = trials(sweep)[1]
    train(second.run, [0.5])
    advance(sweep.pk)
    second = trials(sweep)[1]
    assert second.state == TrialState.FAILED and "its evaluation was refused" in second.reason
    with pytest.raises(ConfigError, match="evaluate: an evaluation's objective is"):
        create_sweep(experiment, SPEC.replace("last: 2}", "last: 2, evaluate: {}}"), user=user)
