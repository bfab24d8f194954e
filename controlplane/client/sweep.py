"""`sweep`: create or update an experiment, start a sweep of it (once per idempotency
key), follow its trials to the end, and gate on the best objective with an exit code.

Gates name the sweep's figures: `best` (the best trial's objective, also as
`best.<metric>` and `best.<metric's last part>`, e.g. `best.success_rate`), and the
counts `complete`, `pruned`, `failed` and `trials`: `--require 'best.success_rate>=0.8'`.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from controlplane.client.gates import Gate, evaluate
from controlplane.client.http import ApiError, ArmatureApi
from controlplane.client.submit import (
    EXIT_API_ERROR,
    EXIT_CANCELLED,
    EXIT_GATE_FAILED,
    EXIT_INTERRUPTED,
    EXIT_SUCCESS,
    TRANSIENT_STATUSES,
    ensure_experiment,
    experiment_name_from,
    idempotency_key,
)
from controlplane.client.sweep_report import SweepOutcome


@dataclass
class SweepOptions:
    config_path: Path
    sweep_path: Path
    url: str
    token: str
    name: str | None = None
    cluster: str | None = None
    wait: bool = False
    gates: list[Gate] = field(default_factory=list)
    poll_interval_s: float = 5.0
    idempotency_key: str | None = None


def figures(sweep: dict[str, Any]) -> dict[str, float]:
    """What gates check: the best objective (once a trial completed) and trial counts."""
    states = [trial.get("state") for trial in sweep.get("trials") or []]
    counted: dict[str, float] = {"trials": len(states)}
    for state in ("complete", "pruned", "failed"):
        counted[state] = states.count(state)
    best = (sweep.get("best") or {}).get("value")
    if isinstance(best, int | float):
        metric = ((sweep.get("spec") or {}).get("objective") or {}).get("metric", "")
        names = {"best", f"best.{metric}", f"best.{metric.rsplit('/', 1)[-1]}"}
        counted.update(dict.fromkeys(sorted(names - {"best."}), best))
    return counted


def progress_line(sweep: dict[str, Any], elapsed_s: float) -> str:
    counted = figures(sweep)
    ended = counted["complete"] + counted["pruned"] + counted["failed"]
    best = sweep.get("best")
    shown = f", best {best['value']:.4g} (trial {best['number']})" if best else ""
    return (f"[{elapsed_s:6.0f}s] sweep {sweep.get('id')} {sweep.get('state')}: "
            f"{counted['trials']} trials, {ended:.0f} ended{shown}")  # fmt: skip


def run_sweep(
    options: SweepOptions,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> SweepOutcome:
    """The whole sweep from the command line; never raises for API errors (they become
    the outcome)."""
    started = datetime.now(UTC)
    api = ArmatureApi(options.url, options.token)
    config_text, spec = options.config_path.read_text(), options.sweep_path.read_text()
    name = options.name or experiment_name_from(config_text, options.config_path)
    outcome = SweepOutcome(
        url=options.url, experiment=name, exit_code=EXIT_API_ERROR, status="error",
        message="", started_at=started, finished_at=started,
    )  # fmt: skip
    try:
        _start_and_follow(api, options, config_text, spec, outcome, out, sleep, clock)
    except ApiError as error:
        outcome.exit_code, outcome.status, outcome.message = EXIT_API_ERROR, "error", str(error)
        print(f"error: {error}", file=out)
    except KeyboardInterrupt:
        outcome.exit_code, outcome.status = EXIT_INTERRUPTED, "interrupted"
        outcome.message = "interrupted"
        sweep = outcome.sweep
        if sweep is not None and sweep.get("state") == "running":
            try:
                api.call("POST", f"sweeps/{sweep['id']}/cancel")
                outcome.message = f"interrupted: cancelled sweep {sweep['id']}"
            except ApiError as error:
                outcome.message = f"interrupted; could not cancel sweep {sweep['id']}: {error}"
        print(outcome.message, file=out)
    outcome.finished_at = datetime.now(UTC)
    return outcome


def _start_and_follow(
    api: ArmatureApi,
    options: SweepOptions,
    config_text: str,
    spec: str,
    outcome: SweepOutcome,
    out: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    outcome.revision, what = ensure_experiment(api, outcome.experiment, config_text, "", "")
    print(f"experiment {outcome.experiment}: revision {outcome.revision} ({what})", file=out)
    body = {"experiment": outcome.experiment, "spec": spec}
    if outcome.revision is not None:
        body["revision"] = outcome.revision
    if options.cluster:
        body["cluster"] = options.cluster
    outcome.idempotency_key = options.idempotency_key or idempotency_key(
        outcome.experiment, f"{config_text}\n---\n{spec}", [], options.cluster
    )
    headers = {"Idempotency-Key": outcome.idempotency_key}
    _, outcome.sweep = api.call("POST", "sweeps", body, headers)
    print(f"sweep {outcome.sweep['id']}: {outcome.sweep_url}", file=out)
    if not options.wait:
        outcome.exit_code, outcome.status = EXIT_SUCCESS, "started"
        outcome.message = f"sweep {outcome.sweep['id']} started"
        return
    _follow(api, outcome, options.poll_interval_s, out, sleep, clock)
    _finish(outcome, options.gates, out)


def _follow(
    api: ArmatureApi,
    outcome: SweepOutcome,
    poll_interval_s: float,
    out: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    started, seen = clock(), None
    while True:
        line = progress_line(outcome.sweep, clock() - started)
        shown = line.split("]", 1)[1]
        if shown != seen:
            print(line, file=out, flush=True)
            seen = shown
        if outcome.sweep.get("state") != "running":
            return
        sleep(poll_interval_s)
        try:
            _, outcome.sweep = api.call("GET", f"sweeps/{outcome.sweep['id']}")
        except ApiError as error:
            if error.status not in TRANSIENT_STATUSES:
                raise


def _finish(outcome: SweepOutcome, gates: list[Gate], out: TextIO) -> None:
    sweep = outcome.sweep
    outcome.figures = figures(sweep)
    print(f"sweep {sweep['id']} {sweep['state']}: {sweep.get('reason') or ''}", file=out)
    for trial in sweep.get("trials") or []:
        value = "—" if trial.get("value") is None else f"{trial['value']:.4g}"
        params = ", ".join(f"{key}={_shown(val)}" for key, val in trial["params"].items())
        print(f"  trial {trial['number']:>3} {trial['state']:<9} {value:>8}  run "
              f"{trial.get('run')}  {params}", file=out)  # fmt: skip
    if sweep.get("importances"):
        ranked = sorted(sweep["importances"].items(), key=lambda item: -item[1])
        print("importances: " + ", ".join(f"{k} {v:.2f}" for k, v in ranked), file=out)
    outcome.message = f"sweep {sweep['id']} {sweep['state']}"
    if sweep["state"] == "cancelled":
        outcome.exit_code, outcome.status = EXIT_CANCELLED, "cancelled"
        return
    outcome.gates = [evaluate(gate, outcome.figures) for gate in gates]
    for result in outcome.gates:
        print(f"gate {result.gate.expression}: {result.message}", file=out)
    if any(not result.passed for result in outcome.gates):
        outcome.exit_code, outcome.status = EXIT_GATE_FAILED, "gate_failed"
    else:
        outcome.exit_code, outcome.status = EXIT_SUCCESS, sweep["state"]


def _shown(value: Any) -> str:
    """A parameter as the table shows it: floats to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)
