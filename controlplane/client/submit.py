"""`submit`: create or update an experiment, launch a run with an idempotency key, follow
it to the end, check the gates, and say how it went with an exit code."""

import hashlib
import json
import os
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from controlplane.client.gates import Gate, GateResult, evaluate
from controlplane.client.http import ApiError, ArmatureApi
from controlplane.client.report import Outcome

# Exit codes (documented in docs/ci.md).
EXIT_SUCCESS = 0
# Episode videos a failed run's client saves at most (the newest).
MAX_SAVED = 200
EXIT_RUN_FAILED = 1
EXIT_USAGE = 2  # also argparse's own code for a bad command line
EXIT_GATE_FAILED = 3
EXIT_CANCELLED = 4
EXIT_TIMED_OUT = 5
EXIT_API_ERROR = 6
EXIT_INTERRUPTED = 130

# "interrupted" ends the wait too: the run needs a person to resume it.
FINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "timed_out", "interrupted"})
STATE_EXIT_CODES = {
    "succeeded": EXIT_SUCCESS,
    "failed": EXIT_RUN_FAILED,
    "cancelled": EXIT_CANCELLED,
    "timed_out": EXIT_TIMED_OUT,
}
# With --timeout the server stops the run itself; the client waits this much longer for
# it to say so before cancelling the run and giving up on its own.
TIMEOUT_GRACE_S = 120.0
# Answers that mean "the server is restarting or overloaded": keep polling through them.
TRANSIENT_STATUSES = frozenset({0, 502, 503, 504})


@dataclass
class SubmitOptions:
    config_path: Path
    url: str
    token: str
    name: str | None = None
    description: str = ""
    message: str = ""
    cluster: str | None = None
    overrides: list[str] = field(default_factory=list)
    wait: bool = False
    timeout_s: int | None = None
    gates: list[Gate] = field(default_factory=list)
    poll_interval_s: float = 2.0
    idempotency_key: str | None = None
    # Where the episode videos of a run that did not pass go (CI artifacts); None: not saved.
    episodes_dir: Path | None = None


def experiment_name_from(config_text: str, config_path: Path) -> str:
    """The config's top-level `name:` (read without a YAML parser: the client has no
    dependencies), else the file name without its extension."""
    for line in config_text.splitlines():
        if line.startswith("name:"):
            value = line[len("name:") :].split(" #", 1)[0].strip().strip("'\"")
            if value:
                return value
    return config_path.stem


# Each CI system's id of one attempt of one job: a retried *command* inside the job
# reuses the run, a re-run of the job launches a new one.
CI_IDENTITIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("github", ("GITHUB_REPOSITORY", "GITHUB_RUN_ID", "GITHUB_RUN_ATTEMPT", "GITHUB_JOB")),
    ("gitlab", ("CI_PROJECT_ID", "CI_JOB_ID")),
    ("buildkite", ("BUILDKITE_JOB_ID",)),
    ("circleci", ("CIRCLE_WORKFLOW_JOB_ID",)),
    ("jenkins", ("BUILD_TAG",)),
)


def ci_identity(env: Mapping[str, str]) -> str | None:
    for system, names in CI_IDENTITIES:
        if env.get(names[-1]):
            return ":".join([system, *(env.get(name, "") for name in names)])
    return None


def idempotency_key(
    experiment: str,
    config_text: str,
    overrides: list[str],
    cluster: str | None,
    env: Mapping[str, str] | None = None,
) -> str:
    """ARMATURE_IDEMPOTENCY_KEY if set; in CI, the job attempt plus a hash of what is
    launched (so two different launches in one job stay two runs); else random."""
    env = os.environ if env is None else env
    if env.get("ARMATURE_IDEMPOTENCY_KEY"):
        return env["ARMATURE_IDEMPOTENCY_KEY"]
    identity = ci_identity(env)
    if identity is None:
        return f"armature-ci-{uuid.uuid4().hex}"
    launch = json.dumps([identity, experiment, config_text, overrides, cluster])
    return f"{identity.split(':', 1)[0]}-{hashlib.sha256(launch.encode()).hexdigest()[:40]}"


def _revision_number(body: Any) -> int | None:
    if not isinstance(body, dict):
        return None
    latest = body.get("latest_revision")
    if isinstance(latest, dict) and isinstance(latest.get("number"), int):
        return latest["number"]
    return body.get("number") if isinstance(body.get("number"), int) else None


def ensure_experiment(
    api: ArmatureApi, name: str, config_text: str, description: str, message: str
) -> tuple[int | None, str]:
    """Create the experiment, or add a revision when its config changed. Returns the
    revision number and what happened."""
    path = f"experiments/{quote(name, safe='')}"
    try:
        api.call("GET", path)
    except ApiError as error:
        if error.status != 404:
            raise
        body = {"name": name, "description": description, "config_yaml": config_text}
        try:
            _, created = api.call("POST", "experiments", body)
            return _revision_number(created), "created"
        except ApiError as create_error:
            if create_error.status not in (400, 409):
                raise
            # Another CI job may have created it in between; if not, this error stands.
            try:
                api.call("GET", path)
            except ApiError:
                raise create_error from None
    status, revision = api.call(
        "POST", f"{path}/revisions", {"config_yaml": config_text, "message": message}
    )
    return _revision_number(revision), "new revision" if status == 201 else "unchanged"


def progress_line(run: Mapping[str, Any], elapsed_s: float) -> str:
    step, total = run.get("progress_step") or 0, run.get("progress_total") or 0
    progress = f"  step {step}/{total} ({100 * step // total}%)" if total else ""
    return f"[{elapsed_s:6.0f}s] run {run.get('id')} {run.get('state')}{progress}"


def submit(
    options: SubmitOptions,
    out: TextIO,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Do the whole submission; never raises for API errors (they become the outcome)."""
    started = datetime.now(UTC)
    config_text = options.config_path.read_text()
    name = options.name or experiment_name_from(config_text, options.config_path)
    outcome = Outcome(
        url=options.url,
        experiment=name,
        exit_code=EXIT_API_ERROR,
        status="error",
        message="",
        started_at=started,
        finished_at=started,
        gates=[_unevaluated(gate) for gate in options.gates],
    )
    api = ArmatureApi(options.url, options.token)
    try:
        _launch_and_follow(api, options, config_text, outcome, out, sleep, clock)
        if options.episodes_dir and outcome.run and outcome.exit_code != EXIT_SUCCESS:
            save_episodes(api, outcome.run["id"], options.episodes_dir, out)
    except ApiError as error:
        outcome.exit_code, outcome.status = EXIT_API_ERROR, "error"
        outcome.message = str(error)
        print(f"error: {error}", file=out)
    except KeyboardInterrupt:
        outcome.exit_code, outcome.status = EXIT_INTERRUPTED, "interrupted"
        outcome.message = "interrupted"
        if outcome.run and outcome.run.get("state") not in FINAL_STATES:
            outcome.message = f"interrupted: cancelled run {outcome.run['id']}"
            _cancel(api, outcome, out)
        print(outcome.message, file=out)
    outcome.finished_at = datetime.now(UTC)
    return outcome


def _launch_and_follow(
    api: ArmatureApi,
    options: SubmitOptions,
    config_text: str,
    outcome: Outcome,
    out: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> None:
    name = outcome.experiment
    revision, what = ensure_experiment(api, name, config_text, options.description, options.message)
    outcome.revision = revision
    print(f"experiment {name}: revision {revision} ({what})", file=out)

    key = options.idempotency_key or idempotency_key(
        name, config_text, options.overrides, options.cluster
    )
    outcome.idempotency_key = key
    body: dict[str, Any] = {"experiment": name, "overrides": options.overrides}
    if revision is not None:
        body["revision"] = revision
    if options.cluster:
        body["cluster"] = options.cluster
    if options.timeout_s:
        body["timeout_s"] = options.timeout_s
    status, run = api.call("POST", "runs", body, headers={"Idempotency-Key": key})
    outcome.run = run
    reused = " (already launched with this idempotency key)" if status == 200 else ""
    print(f"run {run['id']} {run['state']}{reused}: {outcome.run_url}", file=out)

    if not options.wait:
        outcome.exit_code, outcome.status = EXIT_SUCCESS, "launched"
        outcome.message = f"run {run['id']} launched"
        return

    launched = clock()
    deadline = launched + options.timeout_s + TIMEOUT_GRACE_S if options.timeout_s else None
    run = _follow(api, run, launched, deadline, options.poll_interval_s, outcome, out, sleep, clock)
    if run["state"] not in FINAL_STATES:
        outcome.exit_code, outcome.status = EXIT_TIMED_OUT, "timed_out"
        outcome.message = (
            f"run {run['id']} still {run['state']} after {options.timeout_s}s "
            f"(+{TIMEOUT_GRACE_S:.0f}s grace): cancelled"
        )
        print(outcome.message, file=out)
        _cancel(api, outcome, out)
        return
    _finish(run, options.gates, outcome, out)


def _follow(
    api: ArmatureApi,
    run: dict[str, Any],
    launched: float,
    deadline: float | None,
    poll_interval_s: float,
    outcome: Outcome,
    out: TextIO,
    sleep: Callable[[float], None],
    clock: Callable[[], float],
) -> dict[str, Any]:
    """Poll the run until it is final or the deadline passes, printing each change."""
    seen: tuple[Any, ...] | None = None
    unreachable = False
    while True:
        now = clock()
        shown = (run.get("state"), run.get("progress_step"), run.get("progress_total"))
        if shown != seen:
            print(progress_line(run, now - launched), file=out, flush=True)
            seen = shown
        if run.get("state") in FINAL_STATES or (deadline is not None and now >= deadline):
            return run
        sleep(poll_interval_s)
        try:
            _, run = api.call("GET", f"runs/{run['id']}")
            outcome.run = run
            if unreachable:
                print("control plane reachable again", file=out)
                unreachable = False
        except ApiError as error:
            if error.status not in TRANSIENT_STATUSES:
                raise
            if not unreachable:
                print(f"warning: {error}; still trying", file=out)
                unreachable = True


def _finish(run: dict[str, Any], gates: list[Gate], outcome: Outcome, out: TextIO) -> None:
    state = run["state"]
    summary = run.get("summary") or {}
    outcome.gates = [evaluate(gate, summary) for gate in gates]
    outcome.gates_evaluated = True
    reason = f": {run['exit_reason']}" if run.get("exit_reason") else ""
    print(f"run {run['id']} {state}{reason}", file=out)
    for key in sorted(summary):
        print(f"  {key} = {summary[key]}", file=out)
    for result in outcome.gates:
        print(f"gate {result.gate.expression}: {result.message}", file=out)
    outcome.exit_code = STATE_EXIT_CODES.get(state, EXIT_RUN_FAILED)
    outcome.status = state
    outcome.message = f"run {run['id']} {state}{reason}"
    missed = [result for result in outcome.gates if not result.passed]
    if state == "succeeded" and missed:
        outcome.exit_code, outcome.status = EXIT_GATE_FAILED, "gate_failed"
        outcome.message = "gate failed: " + "; ".join(result.message for result in missed)


def save_episodes(api: ArmatureApi, run_id: int, folder: Path, out: TextIO) -> int:
    """The run's recorded episodes into `folder`: each video as <name>.mp4 beside
    episodes.json (their records: task, outcome, who acted at each step); how many
    videos were saved. The newest MAX_SAVED, thinned ones (deleted on the server to
    keep its budget) listed but not saved."""
    _, page = api.call("GET", f"runs/{run_id}/episodes?page_size={MAX_SAVED}")
    folder.mkdir(parents=True, exist_ok=True)
    episodes = page.get("results", [])
    (folder / "episodes.json").write_text(json.dumps(episodes, indent=2))
    saved = 0
    for episode in episodes:
        name = str(episode.get("name", ""))
        if episode.get("thinned") or not name.replace("-", "").replace("_", "").isalnum():
            continue
        api.download(f"runs/{run_id}/episodes/{name}.mp4", folder / f"{name}.mp4")
        saved += 1
    print(f"saved {saved} episode video(s) of run {run_id} to {folder}", file=out)
    return saved


def _cancel(api: ArmatureApi, outcome: Outcome, out: TextIO) -> None:
    run = outcome.run or {}
    try:
        _, outcome.run = api.call("POST", f"runs/{run['id']}/cancel")
    except ApiError as error:
        print(f"warning: could not cancel run {run.get('id')}: {error}", file=out)


def _unevaluated(gate: Gate) -> GateResult:
    return GateResult(gate, False, None, None, "not evaluated: the run did not finish")
