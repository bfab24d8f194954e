"""The CI client's sweep command without a server: what its gates read, and what it
refuses before calling anything."""

from pathlib import Path

import pytest

from controlplane.client.__main__ import main
from controlplane.client.gates import evaluate, parse_gate
from controlplane.client.sweep import figures

SWEEP = {
    "id": 4, "state": "finished", "spec": {"objective": {"metric": "rollout/success_rate"}},
    "best": {"number": 2, "value": 0.75, "params": {}, "run": 9},
    "trials": [{"state": "complete"}, {"state": "pruned"}, {"state": "complete"},
               {"state": "failed"}],
}  # fmt: skip


def test_gates_read_the_best_objective_by_its_metric_and_the_trial_counts():
    found = figures(SWEEP)
    assert found == {"trials": 4, "complete": 2, "pruned": 1, "failed": 1, "best": 0.75,
                     "best.rollout/success_rate": 0.75, "best.success_rate": 0.75}  # fmt: skip
    assert evaluate(parse_gate("best.success_rate>=0.8"), found).passed is False
    assert evaluate(parse_gate("failed<=1"), found).passed is True
    before = figures({**SWEEP, "best": None})
    result = evaluate(parse_gate("best>=0"), before)
    assert not result.passed and "not among" in result.message  # no trial completed yet


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--require", "best>=0.5"], "--require needs --wait"),
        (["--wait", "--require", "best=>0.5"], "bad gate"),
        (["--wait", "--poll-interval", "0"], "--poll-interval must be positive"),
    ],
)
def test_usage_errors_exit_2_before_anything_is_called(
    tmp_path: Path, capsys, monkeypatch, argv: list[str], message: str
):
    monkeypatch.setenv("ARMATURE_TOKEN", "arm_x")
    for name in ("experiment.yaml", "sweep.yaml"):
        (tmp_path / name).write_text("{}\n")
    code = main(["sweep", str(tmp_path / "experiment.yaml"), str(tmp_path / "sweep.yaml"),
                 "--url", "http://127.0.0.1:9", *argv])  # fmt: skip
    assert code == 2 and message in capsys.readouterr().err


def test_a_missing_sweep_file_is_a_usage_error(tmp_path: Path, capsys, monkeypatch):
    monkeypatch.setenv("ARMATURE_TOKEN", "arm_x")
    (tmp_path / "experiment.yaml").write_text("{}\n")
    assert main(["sweep", str(tmp_path / "experiment.yaml"), str(tmp_path / "nope.yaml")]) == 2
    assert "no such file" in capsys.readouterr().err
