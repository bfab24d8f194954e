"""What a CI job keeps of a sweep: a JSON summary and a JUnit XML report (a test case per
trial and one per gate), as `report.py` does for one run."""

import json
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from controlplane.client.gates import GateResult
from controlplane.client.report import closed_tree, write_tree


@dataclass
class SweepOutcome:
    """Everything known about one sweep when the client stops."""

    url: str
    experiment: str
    exit_code: int
    status: str  # finished, cancelled, gate_failed, started, interrupted, error
    message: str
    started_at: datetime
    finished_at: datetime
    revision: int | None = None
    idempotency_key: str | None = None
    sweep: dict[str, Any] | None = None
    figures: dict[str, float] = field(default_factory=dict)
    gates: list[GateResult] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return round((self.finished_at - self.started_at).total_seconds(), 3)

    @property
    def sweep_url(self) -> str | None:
        return f"{self.url.rstrip('/')}/sweeps/{self.sweep['id']}/" if self.sweep else None

    def to_dict(self) -> dict[str, Any]:
        sweep = self.sweep or {}
        return {
            "status": self.status, "exit_code": self.exit_code, "message": self.message,
            "url": self.url, "experiment": self.experiment, "revision": self.revision,
            "idempotency_key": self.idempotency_key, "sweep_id": sweep.get("id"),
            "sweep_url": self.sweep_url, "state": sweep.get("state"),
            "reason": sweep.get("reason"), "best": sweep.get("best"), "figures": self.figures,
            "trials": sweep.get("trials") or [], "importances": sweep.get("importances") or {},
            "gates": [result.to_dict() for result in self.gates],
            "started_at": self.started_at.isoformat(),
            "finished_at": self.finished_at.isoformat(), "duration_s": self.duration_s,
        }  # fmt: skip


def write_json(outcome: SweepOutcome, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(outcome.to_dict(), indent=2) + "\n")


def junit_tree(outcome: SweepOutcome) -> ET.ElementTree:
    """A case per trial (a failed trial fails; pruned and cancelled ones are skipped) and
    one per gate; no sweep at all is one error."""
    name = f"armature.sweep.{outcome.experiment}"
    suites = ET.Element("testsuites", name="armature")
    suite = ET.SubElement(suites, "testsuite", name=name, timestamp=outcome.started_at.astimezone(
        UTC).replace(tzinfo=None).isoformat("T"))  # fmt: skip
    properties = ET.SubElement(suite, "properties")
    sweep = outcome.sweep or {}
    shown = {"url": outcome.url, "sweep_id": sweep.get("id"), "sweep_url": outcome.sweep_url,
             "state": sweep.get("state")}  # fmt: skip
    for key, value in shown.items():
        if value not in (None, ""):
            ET.SubElement(properties, "property", name=key, value=str(value))
    counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    if not sweep:
        counts["tests"] += 1
        case = ET.SubElement(suite, "testcase", classname=name, name="start")
        ET.SubElement(case, "error", message=outcome.message, type=outcome.status)
        counts["errors"] += 1
    for trial in sorted(sweep.get("trials") or [], key=lambda t: t["number"]):
        counts["tests"] += 1
        params = ", ".join(f"{key}={value}" for key, value in trial["params"].items())
        title = f"trial {trial['number']} (run {trial.get('run')}): {params}"
        case = ET.SubElement(suite, "testcase", classname=f"{name}.trials", name=title)
        if trial["state"] == "failed":
            failure = ET.SubElement(case, "failure", message=trial.get("reason") or "failed",
                                    type="trial")  # fmt: skip
            failure.text = trial.get("reason") or ""
            counts["failures"] += 1
        elif trial["state"] in ("pruned", "cancelled", "running"):
            ET.SubElement(case, "skipped", message=f"{trial['state']}: {trial.get('reason', '')}")
            counts["skipped"] += 1
        if trial.get("value") is not None:
            ET.SubElement(case, "system-out").text = f"objective = {trial['value']}"
    for result in outcome.gates:
        counts["tests"] += 1
        case = ET.SubElement(suite, "testcase", classname=f"{name}.gates",
                             name=result.gate.expression)  # fmt: skip
        if not result.passed:
            ET.SubElement(
                case, "failure", message=result.message, type="gate"
            ).text = result.message
            counts["failures"] += 1
    return closed_tree(suites, suite, counts, outcome.duration_s)


def write_junit(outcome: SweepOutcome, path: Path) -> None:
    write_tree(junit_tree(outcome), path)
