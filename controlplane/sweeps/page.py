"""What a sweep's page shows, read in one place for the view and the live socket: the
header, the trials table and the importances as HTML fragments, and the charts' data
(each parameter against the objective, the best so far over trials) as JSON."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser
from django.template.loader import render_to_string

from controlplane.access.doors import may
from controlplane.sweeps import services
from controlplane.sweeps.models import Sweep, TrialState
from controlplane.sweeps.progress import planned_trials


def sweep_context(sweep: Sweep, user: AbstractBaseUser | AnonymousUser) -> dict[str, Any]:
    spec = services.spec_of(sweep)
    trials = services.ranked_trials(sweep)
    for trial in trials:  # the table's cells, in the space's order
        trial.shown_params = [(key, _shown(trial.params.get(key))) for key in spec.space]
    best = services.best_trial(sweep)
    importances = services.importances(sweep)
    return {
        "sweep": sweep,
        "spec": spec,
        "keys": list(spec.space),
        "trials": trials,
        "best": best,
        "planned": planned_trials(spec),
        "ended": sum(trial.has_ended for trial in trials),
        "importances": sorted(importances.items(), key=lambda item: -item[1]),
        "can_cancel": not sweep.is_final
        and sweep.cancel_requested_at is None
        and may(user, "sweep-cancel", "POST"),
        "can_write_best": best is not None and may(user, "sweep-best-revision", "POST"),
    }


def _shown(value: Any) -> str:
    """A parameter's value in a cell: floats to 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


FRAGMENTS = {
    "sweep-header": "sweeps/_sweep_header.html",
    "sweep-trials": "sweeps/_sweep_trials.html",
    "sweep-importances": "sweeps/_sweep_importances.html",
}


def live_fragments(sweep_id: int, user: AbstractBaseUser | AnonymousUser) -> dict[str, str]:
    """The page's live parts by element id ({} for no such sweep)."""
    sweep = Sweep.objects.filter(pk=sweep_id).select_related("experiment", "revision").first()
    if sweep is None:
        return {}
    context = sweep_context(sweep, user)
    return {key: render_to_string(name, context) for key, name in FRAGMENTS.items()}


def chart_data(sweep: Sweep) -> dict[str, Any]:
    """The charts' data: every trial with a value in trial order, and the best complete
    objective after each trial (None before the first)."""
    spec = services.spec_of(sweep)
    sign = 1.0 if spec.objective.direction == "max" else -1.0
    points, best_so_far, best = [], [], None
    for trial in sweep.trials.order_by("number"):
        if trial.value is not None:
            points.append({"number": trial.number, "state": trial.state,
                           "value": trial.value, "params": trial.params})  # fmt: skip
        complete = trial.state == TrialState.COMPLETE
        if complete and (best is None or sign * trial.value > sign * best):
            best = trial.value
        best_so_far.append([trial.number, best])
    choices = {key: dim.choice for key, dim in spec.space.items() if dim.choice is not None}
    return {
        "sweep": sweep.pk, "metric": spec.objective.metric, "direction": spec.objective.direction,
        "keys": list(spec.space), "log": [k for k, d in spec.space.items() if d.loguniform],
        "choices": choices, "trials": points, "best_so_far": best_so_far,
    }  # fmt: skip
