"""`sweep`: create or update an experiment, start a sweep of it (once per idempotency
key), follow its trials to the end, and gate on the best objective with an exit code.

Gates name the sweep's figures: `best` (the best trial's objective), `complete`,
`pruned`, `failed` and `trials` (counts), e.g. `--require 'best>=0.6'`.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass, field
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
    """What gates check: the best objective (when a trial completed) and trial counts."""
    states = [trial.get("state") for trial in sweep.get("trials") or []]
    counted: dict[str, float] = {"trials": len(states)}
    for state in ("complete", "pruned", "failed"):
        counted[state] = states.count(state)
    best = sweep.get("best") or {}
    if isinstance(best.get("value"), int | float):
        counted["best"] = best["value"]
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
) -> int:
    """The whole sweep from the command line; its exit code (never raises for the API)."""
    api = ArmatureApi(options.url, options.token)
    config_text, spec = options.config_path.read_text(), options.sweep_path.read_text()
    name = options.name or experiment_name_from(config_text, options.config_path)
    sweep: dict[str, Any] | None = None
    try:
        revision, what = ensure_experiment(api, name, config_text, "", "")
        print(f"experiment {name}: revision {revision} ({what})", file=out)
        body = {"experiment": name, "spec": spec, "revision": revision}
        if options.cluster:
            body["cluster"] = options.cluster
        key = options.idempotency_key or idempotency_key(
            name, config_text + "\n---\n" + spec, [], options.cluster
        )
        _, sweep = api.call("POST", "sweeps", body, {"Idempotency-Key": key})
        print(f"sweep {sweep['id']}: {options.url.rstrip('/')}/sweeps/{sweep['id']}/", file=out)
        if not options.wait:
            return EXIT_SUCCESS
        sweep = _follow(api, sweep, options.poll_interval_s, out, sleep, clock)
    except ApiError as error:
        print(f"error: {error}", file=out)
        return EXIT_API_ERROR
    except KeyboardInterrupt:
        if sweep is not None and sweep.get("state") == "running":
            try:
                api.call("POST", f"sweeps/{sweep['id']}/cancel")
                print(f"interrupted: cancelled sweep {sweep['id']}", file=out)
            except ApiError as error:
                print(f"interrupted; could not cancel sweep {sweep['id']}: {error}", file=out)
        return EXIT_INTERRUPTED
    return _finish(sweep, options.gates, out)


def _follow(
    api: ArmatureApi,
    sweep: dict[str, Any],
    poll_interval_s: float,
    out: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> dict[str, Any]:
    started, seen = clock(), None
    while True:
        line = progress_line(sweep, clock() - started)
        if line.split("]", 1)[1] != seen:
            print(line, file=out, flush=True)
            seen = line.split("]", 1)[1]
        if sweep.get("state") != "running":
            return sweep
        sleep(poll_interval_s)
        try:
            _, sweep = api.call("GET", f"sweeps/{sweep['id']}")
        except ApiError as error:
            if error.status not in TRANSIENT_STATUSES:
                raise


def _finish(sweep: dict[str, Any], gates: list[Gate], out: TextIO) -> int:
    print(f"sweep {sweep['id']} {sweep['state']}: {sweep.get('reason') or ''}", file=out)
    for trial in sweep.get("trials") or []:
        value = "—" if trial.get("value") is None else f"{trial['value']:.4g}"
        params = ", ".join(f"{key}={val}" for key, val in trial["params"].items())
        print(f"  trial {trial['number']:>3} {trial['state']:<9} {value:>8}  run "
              f"{trial.get('run')}  {params}", file=out)  # fmt: skip
    if sweep.get("importances"):
        ranked = sorted(sweep["importances"].items(), key=lambda item: -item[1])
        print("importances: " + ", ".join(f"{k} {v:.2f}" for k, v in ranked), file=out)
    if sweep["state"] == "cancelled":
        return EXIT_CANCELLED
    results = [evaluate(gate, figures(sweep)) for gate in gates]
    for result in results:
        print(f"gate {result.gate.expression}: {result.message}", file=out)
    return EXIT_GATE_FAILED if any(not result.passed for result in results) else EXIT_SUCCESS
