"""A sweep from the CI client against a real control plane (daphne, a Celery worker with
its beat, a Ray head): every trial is a real run of the built-in env on Ray, the sweep
ends by itself, and the client gates on its best objective."""

import os
import subprocess
import sys

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.api.tokens import create_token
from controlplane.runs.models import Run, RunState
from controlplane.sweeps.models import Sweep, SweepState, TrialState

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(500)]

SWEEP = """space:
  actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
objective: {metric: rollout/success_rate, direction: max, last: 2}
budget: {trials: 3, parallel: 2}
sampler: random
pruner: none
"""


def test_the_client_runs_a_sweep_of_real_runs_and_gates_on_its_best(
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
    done = subprocess.run(
        [sys.executable, "-m", "controlplane.client", "sweep", str(tmp_path / "experiment.yaml"),
         str(tmp_path / "sweep.yaml"), "--url", url, "--wait", "--require", "best>=0",
         "--require", "complete==3", "--poll-interval", "1"],
        cwd=settings.BASE_DIR, env={**env, "ARMATURE_TOKEN": token},
        capture_output=True, text=True, timeout=450,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (sweep,) = Sweep.objects.all()
    assert sweep.state == SweepState.FINISHED and sweep.reason == "all 3 trials ended"
    trials = list(sweep.trials.select_related("run"))
    assert [trial.state for trial in trials] == [TrialState.COMPLETE] * 3
    for trial in trials:
        assert trial.run.state == RunState.SUCCEEDED and trial.run.progress_step == 3
        assert trial.run.config["actor"]["learning_rate"] == pytest.approx(
            trial.params["actor.learning_rate"]
        )
    assert Run.objects.count() == 3  # each trial once
    assert f"sweep {sweep.pk} finished: all 3 trials ended" in done.stdout
    assert "gate best>=0: best = " in done.stdout and "passed" in done.stdout
