"""The CI client's pure parts: gates, experiment names, idempotency keys, reports."""

import json
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from controlplane.client.__main__ import main
from controlplane.client.gates import Gate, GateSyntaxError, evaluate, parse_gate
from controlplane.client.report import Outcome, write_json, write_junit
from controlplane.client.submit import experiment_name_from, idempotency_key

SUMMARY = {"rollout/success_rate": 0.85, "losses/approx_kl": 0.01, "charts/SPS": 1200}


@pytest.mark.parametrize(
    ("text", "gate"),
    [
        ("success_rate>=0.8", Gate("success_rate>=0.8", "success_rate", ">=", 0.8)),
        (" rollout/success_rate > 0.5 ", Gate("rollout/success_rate > 0.5",
                                              "rollout/success_rate", ">", 0.5)),
        ("losses/approx_kl<1e-2", Gate("losses/approx_kl<1e-2", "losses/approx_kl", "<", 0.01)),
        ("charts/SPS != -3", Gate("charts/SPS != -3", "charts/SPS", "!=", -3.0)),
        ("x==1", Gate("x==1", "x", "==", 1.0)),
        ("x<=.5", Gate("x<=.5", "x", "<=", 0.5)),
    ],
)  # fmt: skip
def test_it_parses_gates(text: str, gate: Gate):
    assert parse_gate(text) == gate


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("success_rate", "expected METRIC OP NUMBER"),
        ("success_rate=0.8", "expected METRIC OP NUMBER"),
        (">=0.8", "expected METRIC OP NUMBER"),
        ("success_rate>=high", "'high' is not a number"),
        ("success_rate>=nan", "the threshold must be finite"),
        ("success rate>=0.8", "expected METRIC OP NUMBER"),
    ],
)
def test_it_refuses_bad_gates_saying_why(text: str, message: str):
    with pytest.raises(GateSyntaxError, match=message):
        parse_gate(text)


def test_short_names_stand_for_the_one_key_ending_so():
    result = evaluate(parse_gate("success_rate>=0.8"), SUMMARY)
    assert (result.passed, result.metric_key, result.value) == (True, "rollout/success_rate", 0.85)
    assert result.message == "rollout/success_rate = 0.85 >= 0.8: passed"
    assert evaluate(parse_gate("approx_kl<0.005"), SUMMARY).passed is False


def test_rollout_wins_when_a_short_name_is_ambiguous():
    summary = {"rollout/success_rate": 0.9, "eval/success_rate": 0.1}
    assert evaluate(parse_gate("success_rate>=0.8"), summary).metric_key == "rollout/success_rate"
    other = evaluate(parse_gate("loss<1"), {"a/loss": 0.1, "b/loss": 0.2})
    assert not other.passed
    assert other.message == "'loss' is ambiguous: a/loss, b/loss"


def test_a_missing_or_odd_metric_fails_the_gate():
    missing = evaluate(parse_gate("reward>=1"), {"rollout/success_rate": 1.0})
    assert not missing.passed
    assert (
        missing.message
        == "'reward' is not among the run's final metrics (known: rollout/success_rate)"
    )
    assert not evaluate(parse_gate("x>=0"), {"x": "high"}).passed
    assert not evaluate(parse_gate("x>=0"), {"x": float("nan")}).passed
    assert not evaluate(parse_gate("x>=0"), {"x": True}).passed


def test_the_experiment_name_comes_from_the_config_or_the_file(tmp_path: Path):
    path = tmp_path / "my-exp.yaml"
    assert (
        experiment_name_from("# c\nname: builtin-ppo  # the name\nenv: {}\n", path) == "builtin-ppo"
    )
    assert experiment_name_from("name: 'quoted'\n", path) == "quoted"
    assert experiment_name_from("env:\n  name: nested\n", path) == "my-exp"


def test_the_idempotency_key_follows_the_ci_job_attempt():
    github = {
        "GITHUB_REPOSITORY": "o/r",
        "GITHUB_RUN_ID": "7",
        "GITHUB_RUN_ATTEMPT": "1",
        "GITHUB_JOB": "train",
    }
    key = idempotency_key("exp", "cfg", ["a=1"], None, github)
    assert key.startswith("github-")
    assert idempotency_key("exp", "cfg", ["a=1"], None, dict(github)) == key
    assert idempotency_key("exp", "cfg", ["a=2"], None, github) != key
    assert (
        idempotency_key("exp", "cfg", ["a=1"], None, {**github, "GITHUB_RUN_ATTEMPT": "2"}) != key
    )
    assert idempotency_key(
        "exp", "cfg", [], None, {"CI_PROJECT_ID": "3", "CI_JOB_ID": "9"}
    ).startswith("gitlab-")
    assert idempotency_key("exp", "cfg", [], None, {"ARMATURE_IDEMPOTENCY_KEY": "mine"}) == "mine"
    assert idempotency_key("exp", "cfg", [], None, {}) != idempotency_key(
        "exp", "cfg", [], None, {}
    )
    assert len(idempotency_key("e" * 500, "cfg", [], None, github)) <= 200


def outcome(state: str | None, gates: list[str], status: str, exit_code: int) -> Outcome:
    start = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    run = None
    if state:
        run = {"id": 42, "state": state, "exit_reason": "boom" if state == "failed" else "",
               "progress_step": 3, "progress_total": 3, "summary": SUMMARY,
               "ray_job_id": "raysubmit_1", "latest_success": 0.875}  # fmt: skip
    summary = SUMMARY if state else {}
    return Outcome(
        url="http://cp:8000", experiment="builtin-ppo", exit_code=exit_code, status=status,
        message=f"run 42 {state}", started_at=start, finished_at=start + timedelta(seconds=61.5),
        revision=2, idempotency_key="k", run=run,
        gates=[evaluate(parse_gate(g), summary) for g in gates], gates_evaluated=bool(state),
    )  # fmt: skip


def test_the_json_summary_says_everything_a_ci_job_needs(tmp_path: Path):
    path = tmp_path / "out" / "summary.json"
    write_json(outcome("succeeded", ["success_rate>=0.9"], "gate_failed", 3), path)
    data = json.loads(path.read_text())
    assert data["status"] == "gate_failed"
    assert data["exit_code"] == 3
    assert data["run_id"] == 42
    assert data["run_url"] == "http://cp:8000/runs/42/"
    assert data["state"] == "succeeded"
    assert data["metrics"] == SUMMARY
    assert data["success"] == 0.875  # the run's success as its pages show it
    assert data["duration_s"] == 61.5
    assert data["gates"] == [{
        "expression": "success_rate>=0.9", "metric": "success_rate",
        "metric_key": "rollout/success_rate", "op": ">=", "threshold": 0.9, "value": 0.85,
        "passed": False, "message": "rollout/success_rate = 0.85 >= 0.9: FAILED",
    }]  # fmt: skip


def junit(tmp_path: Path, result: Outcome) -> ET.Element:
    path = tmp_path / "report.xml"
    write_junit(result, path)
    assert path.read_text().startswith("<?xml version='1.0' encoding='utf-8'?>")
    return ET.parse(path).getroot()


def test_junit_has_a_case_for_the_run_and_one_per_gate(tmp_path: Path):
    root = junit(
        tmp_path, outcome("succeeded", ["success_rate>=0.8", "success_rate>=0.9"], "gate_failed", 3)
    )
    suite = root.find("testsuite")
    assert suite.get("name") == "armature.builtin-ppo"
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "0")
    assert root.get("failures") == "1"
    assert suite.get("time") == "61.500"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == ["run 42", "success_rate>=0.8", "success_rate>=0.9"]
    assert cases[0].find("failure") is None
    assert "rollout/success_rate = 0.85" in cases[0].find("system-out").text
    assert cases[1].find("failure") is None
    assert cases[2].find("failure").get("message") == "rollout/success_rate = 0.85 >= 0.9: FAILED"
    properties = {p.get("name"): p.get("value") for p in suite.find("properties")}
    assert properties["run_id"] == "42"
    assert properties["ray_job_id"] == "raysubmit_1"


def test_junit_marks_a_failed_run_as_a_failure(tmp_path: Path):
    suite = junit(tmp_path, outcome("failed", [], "failed", 1)).find("testsuite")
    failure = suite.find("testcase").find("failure")
    assert failure.get("type") == "failed"
    assert failure.text == "boom"


def test_junit_marks_a_launch_that_never_happened_as_an_error(tmp_path: Path):
    result = outcome(None, ["success_rate>=0.8"], "error", 6)
    result.message = "POST experiments → 400: env.name: unknown env"
    suite = junit(tmp_path, result).find("testsuite")
    cases = suite.findall("testcase")
    assert cases[0].get("name") == "launch"
    assert cases[0].find("error").get("message") == result.message
    assert cases[1].find("skipped") is not None
    assert (suite.get("errors"), suite.get("skipped")) == ("1", "1")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--require", "success_rate=>0.8", "--wait"], "bad gate 'success_rate=>0.8'"),
        (["--require", "success_rate>=0.8"], "--require needs --wait"),
        (["--set", "novalue"], "--set needs KEY=VALUE"),
        (["--timeout", "0"], "--timeout must be a positive"),
    ],
)
def test_usage_errors_exit_2_with_a_message(tmp_path: Path, capsys, argv: list[str], message: str):
    config = tmp_path / "exp.yaml"
    config.write_text("name: exp\n")
    assert main(["submit", str(config), "--token", "arm_x_y", *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_missing_token_or_file_is_a_usage_error(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.delenv("ARMATURE_TOKEN", raising=False)
    config = tmp_path / "exp.yaml"
    config.write_text("name: exp\n")
    assert main(["submit", str(config)]) == 2
    assert "no API token" in capsys.readouterr().err
    assert main(["submit", str(tmp_path / "nope.yaml"), "--token", "t"]) == 2
    assert "no such config file" in capsys.readouterr().err
