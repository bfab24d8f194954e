"""Making, cancelling and reading sweeps; the steps that run them are `progress.py`'s."""

from __future__ import annotations

import io
import uuid
from typing import Any

import optuna
from django.db import IntegrityError, transaction
from django.utils import timezone
from ruamel.yaml import YAML

from controlplane.experiments.models import Experiment, Revision
from controlplane.experiments.services import save_revision
from controlplane.inventory.models import Cluster
from controlplane.runs.launch import freeze_config
from controlplane.sweeps import dispatch
from controlplane.sweeps.capacity import exclusive_devices
from controlplane.sweeps.models import Sweep, Trial, TrialState
from controlplane.sweeps.space import SweepSpec, check_sweep, overrides
from controlplane.sweeps.storage import create_study, load_study
from trainer.config.errors import ConfigError
from trainer.config.loading import apply_override, parse_yaml


def create_sweep(
    experiment: Experiment,
    spec_yaml: str,
    *,
    user,
    revision: Revision | None = None,
    cluster: Cluster | None = None,
    idempotency_key: str | None = None,
) -> tuple[Sweep, bool]:
    """A running sweep of the revision (the experiment's latest by default), its study in
    Optuna's storage, and its first step queued: (sweep, True); (the sweep, False) when
    this user already made one with `idempotency_key`. Raises ConfigError with every
    problem at its key path: the sweep's own, and what launching the experiment would
    refuse."""
    existing = _sweep_with_key(user, idempotency_key)
    if existing is not None:
        return existing, False
    revision = revision or experiment.latest_revision
    data = parse_yaml(spec_yaml, "the sweep")
    spec = check_sweep(parse_yaml(revision.config_yaml) or {}, data)
    frozen = freeze_config(revision, [], cluster, user)  # refused at launch: refused now
    held = exclusive_devices(frozen)
    if held and spec.budget.parallel > 1:
        raise ConfigError.single(
            ("budget", "parallel"),
            f"{spec.budget.parallel} trials at once cannot be placed: every trial's run "
            f"holds {', '.join(held[:4])}{' …' if len(held) > 4 else ''}; set parallel: 1",
            rule="sweep.capacity",
        )
    study_name = f"armature-sweep-{uuid.uuid4().hex}"
    create_study(study_name, spec)  # first: the step the commit queues loads it
    try:
        with transaction.atomic():
            sweep = Sweep.objects.create(
                experiment=experiment, revision=revision, cluster=cluster, spec_yaml=spec_yaml,
                spec=spec.model_dump(mode="json"), created_by=user, study_name=study_name,
                idempotency_key=idempotency_key,
            )  # fmt: skip
            dispatch.advance_later(sweep.pk)
    except IntegrityError:  # the same key raced in from a second request
        return _sweep_with_key(user, idempotency_key), False
    return sweep, True


def _sweep_with_key(user, idempotency_key: str | None) -> Sweep | None:
    if not idempotency_key:
        return None
    return Sweep.objects.filter(created_by=user, idempotency_key=idempotency_key).first()


def cancel_sweep(sweep: Sweep) -> Sweep:
    """Record the cancel; the next step stops the running trials' runs and ends the sweep
    once they have ended."""
    if not sweep.is_final and sweep.cancel_requested_at is None:
        Sweep.objects.filter(pk=sweep.pk, cancel_requested_at__isnull=True).update(
            cancel_requested_at=timezone.now()
        )
        dispatch.advance_later(sweep.pk)
    sweep.refresh_from_db()
    return sweep


def spec_of(sweep: Sweep) -> SweepSpec:
    return SweepSpec.model_validate(sweep.spec)


def best_trial(sweep: Sweep) -> Trial | None:
    """The complete trial with the best objective (the earliest among equals)."""
    complete = [t for t in sweep.trials.all() if t.state == TrialState.COMPLETE]
    if not complete:
        return None
    sign = -1.0 if spec_of(sweep).objective.direction == "max" else 1.0
    return min(complete, key=lambda trial: (sign * trial.value, trial.number))


def ranked_trials(sweep: Sweep) -> list[Trial]:
    """Every trial, best objective first (complete ones, then the rest by their latest
    value), then by number."""
    sign = -1.0 if spec_of(sweep).objective.direction == "max" else 1.0
    return sorted(
        sweep.trials.select_related("run"),
        key=lambda t: (t.state != TrialState.COMPLETE, t.value is None,
                       sign * (t.value or 0.0), t.number),
    )  # fmt: skip


def importances(sweep: Sweep) -> dict[str, float]:
    """Optuna's parameter importances (fANOVA) over the complete trials; empty until two
    trials have completed, or when a single parameter is searched (it is all of it)."""
    if len(spec_of(sweep).space) < 2:
        return {}
    done = sweep.trials.filter(state=TrialState.COMPLETE).count()
    if done < 2:
        return {}
    try:
        found = optuna.importance.get_param_importances(load_study(sweep))
    except (ValueError, RuntimeError):  # e.g. every complete trial had one value
        return {}
    return {key: float(value) for key, value in found.items()}


def revision_from_best(sweep: Sweep, author) -> Revision:
    """A revision of the sweep's experiment: the revision it searched with the best
    trial's values written in (its comments and layout kept). Raises ConfigError when no
    trial has completed."""
    best = best_trial(sweep)
    if best is None:
        raise ConfigError.single("sweep", "no trial has completed yet", rule="sweep.no_best")
    yaml = YAML()  # round trip: the revision's comments and order stay
    document = yaml.load(sweep.revision.config_yaml) or {}
    for override in overrides(best.params):
        apply_override(document, override)
    stream = io.StringIO()
    yaml.dump(document, stream)
    settings = ", ".join(f"{key}={value}" for key, value in best.params.items())
    message = f"best trial {best.number} of sweep {sweep.pk}: {settings}"[:300]
    return save_revision(sweep.experiment, stream.getvalue(), author=author, message=message)


def trial_rows(sweep: Sweep) -> list[dict[str, Any]]:
    """The trials as pages and the API show them, best first."""
    return [
        {
            "number": trial.number, "state": trial.state, "params": trial.params,
            "value": trial.value, "step": trial.reported_step, "reason": trial.reason,
            "run": trial.run_id,
        }
        for trial in ranked_trials(sweep)
    ]  # fmt: skip
