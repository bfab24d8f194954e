"""A sweep from the CI client against a real control plane (daphne, a Celery worker with
its beat, a Ray head), on PostgreSQL and in the one-machine mode: six trials of the
built-in PPO's learning rate, two at a time, each a real run on Ray; the worker is
restarted mid-sweep and nothing is launched twice; the client gates on the best
objective and writes its JSON and JUnit reports."""

import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.api.tokens import create_token
from controlplane.runs.models import Run, RunState
from controlplane.sweeps.models import Sweep, SweepState, TrialState
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(600),
              pytest.mark.embedded]  # fmt: skip

SWEEP = """space:
  actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
objective: {metric: rollout/success_rate, direction: max, last: 2}
budget: {trials: 6, parallel: 2}
sampler: tpe
pruner: none
"""


def test_the_client_runs_a_sweep_of_real_runs_through_a_worker_restart(
    stack_factory, ray_head, settings, tmp_path
):
    settings.RAY_ADDRESS = ray_head.url
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    url = stack.start_web()
    stack.start_worker()
    operator = get_user_model().objects.create_user("ci-operator")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    _, token = create_token(operator, "CI")
    config = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
    (tmp_path / "experiment.yaml").write_text(config.replace("iterations: 60", "iterations: 3"))
    (tmp_path / "sweep.yaml").write_text(SWEEP)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "ARMATURE_"))}
    client = subprocess.Popen(
        [sys.executable, "-m", "controlplane.client", "sweep", str(tmp_path / "experiment.yaml"),
         str(tmp_path / "sweep.yaml"), "--url", url, "--wait",
         "--require", "best.success_rate>=0", "--require", "complete==6",
         "--poll-interval", "1", "--json-out", str(tmp_path / "sweep.json"),
         "--junit-out", str(tmp_path / "sweep.xml")],
        cwd=settings.BASE_DIR, env={**env, "ARMATURE_TOKEN": token},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        # The worker goes while the first two trials train, and a new one takes over.
        wait_until(lambda: Run.objects.filter(state=RunState.RUNNING).count() >= 1, 240,
                   "a trial's run to be training")  # fmt: skip
        stack.stop_worker()
        time.sleep(2)
        stack.start_worker()
        out, _ = client.communicate(timeout=540)
    finally:
        client.kill()
    assert client.returncode == 0, out
    (sweep,) = Sweep.objects.all()
    assert sweep.state == SweepState.FINISHED and sweep.reason == "all 6 trials ended", out
    trials = list(sweep.trials.select_related("run"))
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 6, out
    for trial in trials:
        assert trial.run.state == RunState.SUCCEEDED and trial.run.progress_step == 3
        assert trial.run.config["actor"]["learning_rate"] == pytest.approx(
            trial.params["actor.learning_rate"]
        )
    assert Run.objects.count() == 6  # each trial once, through the restart
    assert f"sweep {sweep.pk} finished: all 6 trials ended" in out
    assert "gate best.success_rate>=0: best.success_rate = " in out
    summary = json.loads((tmp_path / "sweep.json").read_text())
    assert summary["status"] == "finished" and summary["figures"]["complete"] == 6
    assert summary["best"]["run"] in {trial.run_id for trial in trials}
    suite = ET.parse(tmp_path / "sweep.xml").getroot().find("testsuite")
    assert suite.get("tests") == "8" and suite.get("failures") == "0"  # 6 trials, 2 gates
