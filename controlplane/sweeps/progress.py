"""Advancing a sweep, one step at a time (a Celery task calls `advance` when the sweep is
made or cancelled, and every few seconds for each sweep still running).

A step follows each running trial's run (its objective so far reported to Optuna, the
pruner asked, the trial told when the run ends), then launches trials until as many run
at once as the budget allows, through the launch path of every run.

Every write is its own commit, ordered so that a step cut short anywhere (a worker
killed, the control plane restarted) is finished by the next one without launching
anything twice:

- a trial Optuna was asked for but that has no row yet is taken up with the same
  parameters (Optuna keeps it running in its own tables);
- a trial's run is launched with an idempotency key of the sweep and trial number, so a
  second launch returns the first run;
- a trial Optuna was already told about is not told again.

Optuna writes through connections of its own (SQLite would block them behind a
transaction held over the step), so steps exclude each other by a lease on the sweep's
row rather than a row lock.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from statistics import fmean

import optuna
from django.db.models import Q
from django.utils import timezone

from controlplane.realtime.groups import sweep_group
from controlplane.realtime.publish import publish
from controlplane.runs.cancellation import request_cancel
from controlplane.runs.evaluations import EvalRequest, EvaluationRefused, request_evaluation
from controlplane.runs.interruption import CannotResume, resume
from controlplane.runs.launch import launch_run
from controlplane.runs.models import ACTIVE_STATES, EVAL_SUCCESS_KEY, MetricPoint, RunState
from controlplane.sweeps.models import Sweep, SweepState, Trial, TrialState
from controlplane.sweeps.space import SweepSpec, overrides
from controlplane.sweeps.storage import load_study, storage, trial_id_of
from trainer.config.errors import ConfigError

log = logging.getLogger(__name__)

LEASE_S = 180  # past the advance task's hard time limit: a lease outlives no holder
FrozenState = optuna.trial.TrialState


def advance(sweep_id: int) -> Sweep:
    """One step of the sweep (nothing when another step holds it, or it has ended)."""
    if not _take_lease(sweep_id):
        return Sweep.objects.get(pk=sweep_id)
    try:
        sweep = Sweep.objects.select_related("experiment", "revision", "cluster",
                                             "created_by").get(pk=sweep_id)  # fmt: skip
        if not sweep.is_final:
            _step(sweep)
    finally:
        Sweep.objects.filter(pk=sweep_id).update(lease_until=None)
        tell_pages(sweep_id)
    return Sweep.objects.get(pk=sweep_id)


def tell_pages(sweep_id: int) -> None:
    """The sweep's open pages read it again. Best effort: a page that misses it reads it
    at the next step."""
    try:
        publish(sweep_group(sweep_id), {"type": "sweep.changed", "sweep": sweep_id})
    except Exception:
        log.warning("sweep %s: could not tell its pages", sweep_id, exc_info=True)


def _take_lease(sweep_id: int) -> bool:
    now = timezone.now()
    free = Q(lease_until__isnull=True) | Q(lease_until__lt=now)
    taken = Sweep.objects.filter(free, pk=sweep_id, state=SweepState.RUNNING)
    return bool(taken.update(lease_until=now + timedelta(seconds=LEASE_S)))


def _step(sweep: Sweep) -> None:
    spec = SweepSpec.model_validate(sweep.spec)
    study = load_study(sweep)
    for trial in sweep.trials.filter(state=TrialState.RUNNING).select_related("run", "eval_run"):
        _follow(sweep, spec, study, trial)
    stopping = _stop_reason(sweep, spec)
    if stopping:
        for trial in sweep.trials.filter(state=TrialState.RUNNING).select_related("run"):
            _end(study, trial, TrialState.CANCELLED, stopping)
        if not _occupied(sweep):
            state = SweepState.CANCELLED if sweep.cancel_requested_at else SweepState.FINISHED
            _finish(sweep, state, stopping)
        return
    _launch(sweep, spec, study)
    planned = planned_trials(spec)
    if sweep.trials.count() >= planned and not _occupied(sweep):
        _finish(sweep, SweepState.FINISHED, f"all {planned} trials ended")


def planned_trials(spec: SweepSpec) -> int:
    """The budget's trials; a grid's points when fewer (each is tried once)."""
    if spec.sampler != "grid":
        return spec.budget.trials
    points = 1
    for dimension in spec.space.values():
        points *= len(dimension.grid())
    return min(spec.budget.trials, points)


def _stop_reason(sweep: Sweep, spec: SweepSpec) -> str:
    if sweep.cancel_requested_at is not None:
        return "the sweep was cancelled"
    limit = spec.budget.wall_time_min
    if limit is not None and timezone.now() > sweep.created_at + timedelta(minutes=limit):
        return f"the sweep's wall time ({limit:g} min) ran out"
    return ""


def _occupied(sweep: Sweep) -> int:
    """Trials that hold a place on the cluster: running ones, and stopped ones whose run
    is still ending (a pruned run saves its checkpoint first)."""
    held = ACTIVE_STATES | {RunState.INTERRUPTED}
    return sweep.trials.filter(
        Q(state=TrialState.RUNNING) | Q(run__state__in=held) | Q(eval_run__state__in=held)
    ).count()


# ----- one running trial ----------------------------------------------------------------
def _follow(sweep: Sweep, spec: SweepSpec, study: optuna.Study, trial: Trial) -> None:
    run = trial.run
    if run is None:  # launched in a step cut short before its run was stored
        _launch_trial(sweep, study, trial)
        return
    if run.state == RunState.INTERRUPTED:  # the control plane stopped under it
        try:
            resume(run.pk, by=f"sweep {sweep.pk}")
        except CannotResume as error:  # its job is still ending: the next step
            log.info("sweep %s: trial %s waits to resume: %s", sweep.pk, trial.number, error)
        return
    if run.state == RunState.SUCCEEDED and spec.objective.by_evaluation:
        _follow_evaluation(sweep, spec, study, trial)
        return
    values = objective_values(run.pk, spec)
    _report(sweep, trial, values)  # the history the pruner compares later trials with
    if run.is_final:
        if run.state == RunState.SUCCEEDED and values:
            trial.value = values[-1][1]
            _end(study, trial, TrialState.COMPLETE, "")
        else:
            why = run.exit_reason or run.state
            if run.state == RunState.SUCCEEDED:
                why = f"the run logged no {spec.objective.metric}"
            _end(study, trial, TrialState.FAILED, f"run {run.pk}: {why}")
    elif trial.reported_step is not None:
        if study.pruner.prune(study, storage().get_trial(trial_id_of(sweep, trial.number))):
            request_cancel(run.pk, f"pruned by sweep {sweep.pk} at step {trial.reported_step}")
            _end(study, trial, TrialState.PRUNED, f"pruned at step {trial.reported_step}")


def _follow_evaluation(sweep: Sweep, spec: SweepSpec, study: optuna.Study, trial: Trial) -> None:
    """A trial whose run has succeeded, with an evaluation's objective: its last
    checkpoint's eval run is launched (once: its idempotency key), then its suite average
    is the trial's value."""
    evaluation = trial.eval_run
    if evaluation is None:
        asked = spec.objective.evaluate
        wanted = EvalRequest(suite=asked.suite, states=asked.states) if asked else EvalRequest()
        try:
            evaluation, _ = request_evaluation(
                trial.run, wanted, user=sweep.created_by,
                idempotency_key=f"sweep-{sweep.pk}-trial-{trial.number}-eval",
            )  # fmt: skip
        except EvaluationRefused as error:
            _end(study, trial, TrialState.FAILED, f"its evaluation was refused: {error}")
            return
        trial.eval_run = evaluation
        trial.save(update_fields=["eval_run"])
    if not evaluation.is_final:
        return
    average = evaluation.summary.get(EVAL_SUCCESS_KEY)
    if evaluation.state == RunState.SUCCEEDED and isinstance(average, int | float):
        trial.value = float(average)
        _end(study, trial, TrialState.COMPLETE, "")
    else:
        why = evaluation.exit_reason or evaluation.state
        _end(study, trial, TrialState.FAILED, f"eval run {evaluation.pk}: {why}")


def _report(sweep: Sweep, trial: Trial, values: list[tuple[int, float]]) -> None:
    """The trial's objective at the steps not reported yet, as Optuna's intermediate
    values."""
    fresh = [(step, value) for step, value in values
             if trial.reported_step is None or step > trial.reported_step]  # fmt: skip
    if not fresh:
        return
    store, trial_id = storage(), trial_id_of(sweep, trial.number)
    if not store.get_trial(trial_id).state.is_finished():  # told by a step cut short
        for step, value in fresh:
            store.set_trial_intermediate_value(trial_id, step, value)
    trial.reported_step, trial.value = fresh[-1]
    trial.save(update_fields=["reported_step", "value"])


def objective_values(run_id: int, spec: SweepSpec) -> list[tuple[int, float]]:
    """(step, objective) at each stored point of the run's objective metric: the mean of
    its last `objective.last` points up to that step, so a trial's intermediate values
    (pruning) and its final one are the same measure."""
    points = list(
        MetricPoint.objects.filter(key__run_id=run_id, key__name=spec.objective.metric)
        .order_by("step")
        .values_list("step", "value")
    )
    last = spec.objective.last
    return [
        (step, fmean(value for _, value in points[max(0, i + 1 - last) : i + 1]))
        for i, (step, _) in enumerate(points)
    ]


def _end(study: optuna.Study, trial: Trial, state: TrialState, reason: str) -> None:
    """Tell Optuna how the trial ended (unless a step cut short told it already), stop its
    run when it is still going, then store the end."""
    told = {
        TrialState.COMPLETE: FrozenState.COMPLETE,
        TrialState.PRUNED: FrozenState.PRUNED,
    }.get(state, FrozenState.FAIL)
    value = trial.value if state == TrialState.COMPLETE else None
    study.tell(trial.number, value, state=told, skip_if_finished=True)
    if state == TrialState.CANCELLED:
        for run in (trial.run, trial.eval_run):
            if run is not None and not run.is_final:
                request_cancel(run.pk, f"cancelled: {reason}")
    trial.state, trial.reason, trial.finished_at = state, reason, timezone.now()
    trial.save(update_fields=["state", "reason", "finished_at", "value"])


# ----- launching ------------------------------------------------------------------------
def _launch(sweep: Sweep, spec: SweepSpec, study: optuna.Study) -> None:
    known = set(sweep.trials.values_list("number", flat=True))
    # Asked for by a step cut short before its row was stored: taken up as they are.
    waiting = [
        frozen for frozen in study.get_trials(deepcopy=False, states=(FrozenState.RUNNING,))
        if frozen.number not in known
    ]  # fmt: skip
    room = spec.budget.parallel - _occupied(sweep)
    left = planned_trials(spec) - len(known)
    for _ in range(max(0, min(room, left))):
        if waiting:
            asked = waiting.pop(0)
            number, params = asked.number, asked.params
        else:
            asked = study.ask(spec.distributions())
            number, params = asked.number, asked.params
        trial, _ = Trial.objects.get_or_create(sweep=sweep, number=number,
                                               defaults={"params": params})  # fmt: skip
        _launch_trial(sweep, study, trial)


def _launch_trial(sweep: Sweep, study: optuna.Study, trial: Trial) -> None:
    """The trial's run, launched as any run is (idempotent: the sweep and trial number are
    its key); a config the launch refuses is a failed trial."""
    try:
        run, _ = launch_run(
            sweep.experiment, user=sweep.created_by, revision=sweep.revision,
            cluster=sweep.cluster, overrides=overrides(trial.params),
            idempotency_key=f"sweep-{sweep.pk}-trial-{trial.number}",
            tags=[f"sweep-{sweep.pk}"],
        )  # fmt: skip
    except ConfigError as error:
        _end(study, trial, TrialState.FAILED, f"refused at launch: {error}")
        return
    trial.run = run
    trial.save(update_fields=["run"])


def _finish(sweep: Sweep, state: SweepState, reason: str) -> None:
    Sweep.objects.filter(pk=sweep.pk, state=SweepState.RUNNING).update(
        state=state, reason=reason, finished_at=timezone.now()
    )
    sweep.refresh_from_db()


def active_sweep_ids() -> list[int]:
    return list(Sweep.objects.filter(state=SweepState.RUNNING).values_list("pk", flat=True))
