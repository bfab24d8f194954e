"""What a CI job keeps of a submission: a JSON summary and a JUnit XML report (one test
case for the run, one per gate), so CI systems show the result in their test views."""

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.client.gates import GateResult


@dataclass
class Outcome:
    """Everything known about one submission when the client stops."""

    url: str
    experiment: str
    exit_code: int
    status: str  # succeeded, failed, cancelled, timed_out, gate_failed, launched, error
    message: str
    started_at: datetime
    finished_at: datetime
    revision: int | None = None
    idempotency_key: str | None = None
    run: dict[str, Any] | None = None
    gates: list[GateResult] = field(default_factory=list)
    gates_evaluated: bool = False

    @property
    def duration_s(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds(), 3)

    @property
    def run_url(self) -> str | None:
        return f"{self.url.rstrip('/')}/runs/{self.run['id']}/" if self.run else None

    def to_dict(self) -> dict[str, Any]:
        run = self.run or {}
        return {
            "status": self.status,
            "exit_code": self.exit_code,
            "message": self.message,
            "url": self.url,
            "experiment": self.experiment,
            "revision": self.revision,
            "idempotency_key": self.idempotency_key,
            "run_id": run.get("id"),
            "run_url": self.run_url,
            "state": run.get("state"),
            "exit_reason": run.get("exit_reason"),
            "progress": {"step": run.get("progress_step"), "total": run.get("progress_total")},
            # The run's success as its pages show it (the last iteration's rollout
            # success; an eval run's suite average).
            "success": run.get("latest_success"),
            "metrics": run.get("summary") or {},
            "gates": [result.to_dict() for result in self.gates],
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(),
            "duration_s": self.duration_s,
            "run": self.run,
        }


def write_json(outcome: Outcome, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outcome.to_dict(), indent=2, sort_keys=False) + "\n")


def junit_tree(outcome: Outcome) -> ET.ElementTree:
    suite_name = f"armature.{outcome.experiment}"
    suites = ET.Element("testsuites", name="armature")
    suite = ET.SubElement(
        suites,
        "testsuite",
        name=suite_name,
        timestamp=outcome.started_at.astimezone(UTC).replace(tzinfo=None).isoformat("T"),
    )
    properties = ET.SubElement(suite, "properties")
    run = outcome.run or {}
    for name, value in (
        ("url", outcome.url),
        ("run_id", run.get("id")),
        ("run_url", outcome.run_url),
        ("revision", outcome.revision),
        ("state", run.get("state")),
        ("ray_job_id", run.get("ray_job_id")),
    ):
        if value not in (None, ""):
            ET.SubElement(properties, "property", name=name, value=str(value))

    run_case = ET.SubElement(
        suite,
        "testcase",
        classname=suite_name,
        name=f"run {run['id']}" if run else "launch",
        time=f"{outcome.duration_s:.3f}",
    )
    counts = {"tests": 1, "failures": 0, "errors": 0, "skipped": 0}
    if not run:
        ET.SubElement(run_case, "error", message=outcome.message, type=outcome.status)
        counts["errors"] += 1
    elif outcome.status == "launched":
        ET.SubElement(run_case, "skipped", message="launched without --wait")
        counts["skipped"] += 1
    elif run.get("state") != "succeeded":
        failure = ET.SubElement(
            run_case, "failure", message=outcome.message, type=run.get("state") or "unknown"
        )
        failure.text = run.get("exit_reason") or outcome.message
        counts["failures"] += 1
    if run.get("summary"):
        out = ET.SubElement(run_case, "system-out")
        out.text = "\n".join(f"{k} = {v}" for k, v in sorted(run["summary"].items()))

    for result in outcome.gates:
        counts["tests"] += 1
        case = ET.SubElement(
            suite, "testcase", classname=f"{suite_name}.gates", name=result.gate.expression
        )
        if not outcome.gates_evaluated:
            ET.SubElement(case, "skipped", message="the run did not reach a final state")
            counts["skipped"] += 1
        elif not result.passed:
            failure = ET.SubElement(case, "failure", message=result.message, type="gate")
            failure.text = result.message
            counts["failures"] += 1
    return closed_tree(suites, suite, counts, outcome.duration_s)


def closed_tree(
    suites: ET.Element, suite: ET.Element, counts: dict[str, int], duration_s: float
) -> ET.ElementTree:
    """The report with its counts and time on both levels, indented."""
    for element in (suites, suite):
        for name, value in counts.items():
            element.set(name, str(value))
        element.set("time", f"{duration_s:.3f}")
    ET.indent(suites)
    return ET.ElementTree(suites)


def write_tree(tree: ET.ElementTree, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def write_junit(outcome: Outcome, path: Path) -> None:
    write_tree(junit_tree(outcome), path)
