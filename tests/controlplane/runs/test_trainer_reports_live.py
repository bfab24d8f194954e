"""End to end: a real trainer process and the link client report to a live daphne
(started as `./armature up` starts it) against the test database."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.db.models import Count

from controlplane.runs.models import MetricPoint, Run, RunEvent, RunState, TelemetryBatch
from controlplane.runs.tokens import make_run_token
from tests.processes import wait_until
from tests.runs import submitted_run
from trainer.link.client import TrainerLink

pytestmark = pytest.mark.django_db(transaction=True)

SMALL = [
    "env.num_parallel_envs=4",
    "algorithm.data_batch_size=8",
    "runner.progress=false",
    "algorithm.update_epochs=1",
    "algorithm.num_minibatches=2",
    "runner.torch_threads=1",
]


@pytest.fixture
def run() -> Run:
    return submitted_run("live-link")


def assert_stored_once(run: Run) -> list[int]:
    seqs = sorted(TelemetryBatch.objects.filter(run=run).values_list("seq", flat=True))
    assert seqs == list(range(1, len(seqs) + 1))
    repeated = (
        MetricPoint.objects.filter(key__run=run).values("key", "step").annotate(n=Count("pk"))
    ).filter(n__gt=1)
    assert not repeated.exists()
    return seqs


def test_a_trainer_process_reports_progress_metrics_and_events(web, run, tmp_path):
    environment = {
        **{k: v for k, v in os.environ.items() if not k.startswith("DJANGO")},
        "ARMATURE_URL": web.url,
        "ARMATURE_RUN_ID": str(run.pk),
        "ARMATURE_RUN_TOKEN": make_run_token(run.pk),
    }
    result = subprocess.run(
        [
            sys.executable, "-m", "trainer", "run", "examples/builtin_ppo.yaml",
            "runner.iterations=3", "runner.checkpoint_every=2", *SMALL,
            f"runner.output_dir={tmp_path}",
        ],
        cwd=settings.BASE_DIR, env=environment, capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "unacknowledged" not in result.stderr and "refused" not in result.stderr

    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED  # the trainer's finished event, at once
    assert (run.progress_step, run.progress_total) == (3, 3)
    assert 0.0 <= run.summary["rollout/success_rate"] <= 1.0
    success = MetricPoint.objects.filter(key__run=run, key__name="rollout/success_rate").order_by(
        "step"
    )
    assert list(success.values_list("step", flat=True)) == [1, 2, 3]
    assert success.last().value == run.summary["rollout/success_rate"]
    assert MetricPoint.objects.filter(key__run=run, key__name="losses/policy_loss").count() == 3
    # The example's two episode videos of iteration 1 come from the recorder's thread,
    # in no fixed place among the others.
    assert RunEvent.objects.filter(run=run, kind="episode").count() == 2
    trainer_events = RunEvent.objects.filter(run=run).exclude(kind__in=("state", "episode"))
    assert list(trainer_events.values_list("kind", flat=True)) == [
        "started", "placed", "model", "checkpoint", "checkpoint", "finished",
    ]  # fmt: skip
    card = trainer_events.get(kind="model").data
    assert card["kind"] == "mlp" and card["parameters"] == card["trainable_parameters"] > 0
    (where,) = trainer_events.get(kind="placed").data["processes"]
    assert (where["component"], where["rank"], where["node_rank"]) == ("actor", 0, 0)
    assert where["pid"] > 0 and where["interpreter"]
    checkpoints = trainer_events.filter(kind="checkpoint")
    assert [e.data["iteration"] for e in checkpoints] == [2, 3]
    # started, placed, model, then metrics + progress per iteration, 2 checkpoints,
    # finished, 2 episode videos.
    assert len(assert_stored_once(run)) == 3 + 3 * 2 + 2 + 1 + 2


def test_the_link_resends_what_a_restarting_web_server_did_not_acknowledge(web, run):
    link = TrainerLink(web.url, run.pk, make_run_token(run.pk))
    for step in (1, 2, 3):
        link.metrics(step, {"rollout/success_rate": step / 10})
    wait_until(lambda: link.pending() == 0, 30, "the first acknowledgements")

    web.close()  # the control plane goes away mid-run
    for step in (4, 5, 6):
        link.metrics(step, {"rollout/success_rate": step / 10})
        link.progress(step, 6)
    assert link.pending() == 6  # nobody there to acknowledge them; training went on
    web.start_web()

    assert link.close(timeout=60) is True
    assert len(assert_stored_once(run)) == 9
    steps = MetricPoint.objects.filter(key__run=run).order_by("step").values_list("step", flat=True)
    assert list(steps) == [1, 2, 3, 4, 5, 6]
    run.refresh_from_db()
    assert run.progress_step == 6
