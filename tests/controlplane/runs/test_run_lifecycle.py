"""End to end on real components: the API launches, a Celery worker submits a Ray job
running `python -m trainer run`, and reconciliation follows it to the end; cancelling
stops the job, whose checkpoint a resume continues from; a worker killed mid-submission
leaves exactly one job."""

import json
import os
import signal
import time

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import artifacts, ray_jobs, reconcile, submission
from controlplane.runs.models import Run, RunEvent, RunState
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(400)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


@pytest.fixture
def live(stack_factory, ray_head, settings):
    settings.RAY_ADDRESS = ray_head.url
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    create_experiment("demo", CONFIG)
    user = get_user_model().objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(user)
    return stack, api


def submit_as_its_task_does(run_id: int, within_s: float = 120) -> None:
    """`submission.submit`, tried again while Ray does not answer in time, as the Celery
    task retries it (controlplane/runs/tasks.py): a loaded machine's dashboard can take
    longer than one request's deadline."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            submission.submit(run_id)
            return
        except ray_jobs.RayUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def state_of(run_id: int) -> str:
    return Run.objects.get(pk=run_id).state


def wait_for_state(run_id: int, states: set[str], timeout_s: float = 180) -> Run:
    wait_until(lambda: state_of(run_id) in states, timeout_s, f"run {run_id} in {states}", 0.5)
    return Run.objects.get(pk=run_id)


def whole_log(run: Run) -> str:
    return b"".join(ray_jobs.log_stream(run.submission_id)).decode()


def jobs_for(run: Run) -> list:
    return [j for j in ray_jobs.client().list_jobs() if j.submission_id == run.submission_id]


@pytest.mark.embedded
def test_a_run_launched_over_the_api_succeeds(live):
    stack, api = live
    created = api.post(
        "/api/v1/runs", {"experiment": "demo", "overrides": ["runner.iterations=3"]}, format="json"
    )
    assert created.status_code == 201
    run = wait_for_state(created.json()["id"], {"succeeded", "failed"})
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    assert run.ray_job_id == run.submission_id
    assert "finished 3/3 iterations" in whole_log(run)
    # No web server in this stack: the trainer's report waited in its spool, and the
    # reconciliation took it in before reading Ray's status.
    assert run.exit_reason == "the trainer finished" and "rollout/success_rate" in run.summary
    # Removed once taken in: just after the report that moved the run's state is stored.
    spool = artifacts.run_artifact_dir(run.pk) / "link-spool" / "attempt-1.jsonl"
    wait_until(lambda: not spool.exists(), 10, "the ingested spool to be removed")
    kinds = list(run.events.values_list("kind", flat=True))
    # Adopted when Ray's reply to the submission was lost (a loaded head) and the retry
    # found the job: one job either way.
    assert kinds[:2] == ["launched", "state"] and kinds[2] in ("submitted", "adopted")
    assert len(jobs_for(run)) == 1


def test_cancelling_a_running_run_stops_its_job(live):
    stack, api = live
    run_id = api.post(
        "/api/v1/runs", {"experiment": "demo", "overrides": ["runner.iterations=100000"]},
        format="json",
    ).json()["id"]  # fmt: skip
    wait_for_state(run_id, {"running"})
    # Ray calls the job running while the trainer still imports torch: a stop then ends
    # it before it has anything to save. Stop it once it trains.
    wait_for_iterations(run_id, 1)
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 202
    run = wait_for_state(run_id, {"cancelled"}, 60)
    wait_until(lambda: ray_jobs.state(run.submission_id).status == "STOPPED", 60, "job stopped")
    # The stopped trainer's last words still count: its checkpoint and `stopped` report
    # (spooled here, no web server) are taken in once its job has ended.
    stopped = wait_for_event(run_id, "stopped", 1)
    assert artifacts.checkpoint_path(run_id, stopped["iteration"]).exists()

    # Resume continues from that checkpoint, as the next attempt.
    wait_until(lambda: Run.objects.get(pk=run_id).job_ended, 60, "the job to be seen ended")
    resumed = api.post(f"/api/v1/runs/{run_id}/resume")
    assert resumed.status_code == 202, resumed.json()
    assert resumed.json()["attempt"] == 2
    wait_for_iterations(run_id, stopped["iteration"] + 1)
    assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 202
    again = wait_for_event(run_id, "stopped", 2)
    assert run.events.filter(kind="started").latest("pk").data["resume"] is True
    assert again["iteration"] > stopped["iteration"]


def wait_for_iterations(run_id: int, count: int, timeout_s: float = 180) -> None:
    """Until the trainer has written `count` iterations to the run's metrics.jsonl."""
    metrics = artifacts.run_artifact_dir(run_id) / "metrics.jsonl"

    def written() -> int:
        return metrics.read_text().count("\n") if metrics.exists() else 0

    wait_until(lambda: written() >= count, timeout_s, f"run {run_id}'s iteration {count}")


def wait_for_event(run_id: int, kind: str, count: int, timeout_s: float = 120) -> dict:
    """The data of the run's `count`th event of `kind`, once stored."""
    events = RunEvent.objects.filter(run_id=run_id, kind=kind).order_by("pk")
    wait_until(lambda: events.count() >= count, timeout_s, f"run {run_id}'s {kind} #{count}")
    return events[count - 1].data


def test_a_worker_killed_during_submission_leaves_one_job_and_a_finished_run(live):
    stack, api = live
    run_id = api.post(
        "/api/v1/runs", {"experiment": "demo", "overrides": ["runner.iterations=3"]}, format="json"
    ).json()["id"]
    wait_until(lambda: state_of(run_id) != "queued", 60, "the worker to pick the run up", 0.05)
    os.killpg(stack.worker.pid, signal.SIGKILL)
    stack.worker.wait()
    stack.worker = None
    stack.start_worker()  # a new worker: reconciliation repairs whatever was cut short
    run = wait_for_state(run_id, {"succeeded", "failed"}, 240)
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    assert len(jobs_for(run)) == 1


def test_submitting_twice_adopts_the_existing_job(live):
    stack, api = live
    stack.stop_worker()  # the test drives the services itself
    run_id = api.post(
        "/api/v1/runs", {"experiment": "demo", "overrides": ["runner.iterations=2"]}, format="json"
    ).json()["id"]
    submission.submit(run_id)
    submission.submit(run_id)  # a retried task
    run = Run.objects.get(pk=run_id)
    assert len(jobs_for(run)) == 1
    assert list(
        run.events.filter(kind__in=["submitted", "adopted"]).values_list("kind", flat=True)
    ) == [
        "submitted",
        "adopted",
    ]


def test_a_job_that_dies_without_reporting_fails_with_its_last_log_lines(live, settings, tmp_path):
    stack, api = live
    stack.stop_worker()  # the test drives the services itself
    dying = tmp_path / "dying-python"
    dying.write_text(
        "#!/bin/sh\necho 'loading the policy'\necho 'Segmentation fault' >&2\nexit 139\n"
    )
    dying.chmod(0o755)
    settings.ARMATURE_TRAINER_PYTHON = str(dying)
    run_id = api.post("/api/v1/runs", {"experiment": "demo"}, format="json").json()["id"]
    submit_as_its_task_does(run_id)
    wait_until(lambda: reconcile.reconcile(run_id).is_final, 120, "the job to end", poll_s=0.5)
    run = Run.objects.get(pk=run_id)
    assert run.state == RunState.FAILED
    assert "Segmentation fault" in run.exit_reason
    assert "loading the policy" in run.exit_reason


def test_two_runs_of_the_same_config_keep_separate_complete_outputs(live):
    stack, api = live
    body = {"experiment": "demo", "overrides": ["runner.iterations=3"]}
    run_ids = [api.post("/api/v1/runs", body, format="json").json()["id"] for _ in range(2)]
    runs = [wait_for_state(run_id, {"succeeded", "failed"}, 240) for run_id in run_ids]
    assert [run.config_yaml for run in runs][0] == runs[1].config_yaml  # byte-identical
    for run in runs:
        assert run.state == RunState.SUCCEEDED, run.exit_reason
        folder = artifacts.run_artifact_dir(run.pk)
        lines = (folder / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["iteration"] for line in lines] == [1, 2, 3]
        assert (folder / "checkpoints" / "iter_000003.pt").is_file()
        assert f"checkpoints: {folder.resolve()}/checkpoints" in whole_log(run)

        listed = api.get(f"/api/v1/runs/{run.pk}/artifacts").json()
        (events,) = (folder / "tensorboard").glob("events.out.tfevents.*")
        videos = sorted(path.relative_to(folder) for path in (folder / "videos").iterdir())
        assert len(videos) == 3  # the example's two episodes of iteration 1, their index
        assert {f["path"]: f["size"] for f in listed} == {
            str(path): (folder / path).stat().st_size
            for path in ("checkpoints/iter_000003.pt", "config.yaml", "metrics.jsonl",
                         events.relative_to(folder), *videos)
        }  # fmt: skip
        download = api.get(f"/api/v1/runs/{run.pk}/artifacts/metrics.jsonl")
        assert b"".join(download) == (folder / "metrics.jsonl").read_bytes()
        assert api.get(f"/api/v1/runs/{run.pk}/artifacts/../../secret_key").status_code == 404


def test_a_job_folder_planted_before_submission_is_never_used(live, settings, tmp_path):
    """Job folders are new at every submission: what another job (or anyone) left at
    the run's old path (a module run before ours, a link the config would be written
    through) is neither uploaded nor written through, and nothing stays behind."""
    stack, api = live
    stack.stop_worker()  # the test drives the services itself
    run_id = api.post(
        "/api/v1/runs", {"experiment": "demo", "overrides": ["runner.iterations=2"]}, format="json"
    ).json()["id"]
    marker, victim = tmp_path / "planted-ran", tmp_path / "victim"
    victim.write_text("untouched")
    planted = settings.VAR_DIR / "jobs" / str(run_id)
    (planted / "trainer").mkdir(parents=True)
    (planted / "trainer" / "__main__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (planted / "config.yaml").symlink_to(victim)
    submission.submit(run_id)
    run = Run.objects.get(pk=run_id)
    wait_until(lambda: ray_jobs.state(run.submission_id).status in {"SUCCEEDED", "FAILED"},
               240, "the job to end", 0.5)  # fmt: skip
    assert ray_jobs.state(run.submission_id).status == "SUCCEEDED"
    assert not marker.exists() and victim.read_text() == "untouched"
    metrics = (artifacts.run_artifact_dir(run_id) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in metrics] == [1, 2]
    left = [p.name for p in (settings.VAR_DIR / "jobs").iterdir() if p.name != str(run_id)]
    assert not [name for name in left if name.startswith(f"run-{run_id}-")]
