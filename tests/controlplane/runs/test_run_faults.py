"""A run's lifecycle under faults, on a real Ray head and a real database: a cancel
racing a submission (both interleavings forced), Ray unreachable during a cancel and
back, a run that never starts in Ray, the channel layer's Redis gone mid-transition."""

import logging
import threading

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import cancellation, interruption, ray_jobs, reconcile, submission, tasks
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from tests.processes import free_port, start, stop, wait_until
from tests.tcp_gate import TcpGate

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


@pytest.fixture
def ray(ray_head, settings, tmp_path):
    """Ray behind a gate the test can close; jobs are a long sleep (the lifecycle, not
    training, is under test)."""
    gate = TcpGate(ray_head.ports.dashboard)
    settings.RAY_ADDRESS = gate.url
    settings.RAY_REQUEST_TIMEOUT_S = 5
    sleeper = tmp_path / "sleeping-python"
    sleeper.write_text("#!/bin/sh\nexec sleep 600\n")
    sleeper.chmod(0o755)
    settings.ARMATURE_TRAINER_PYTHON = str(sleeper)
    yield gate
    gate.close()


@pytest.fixture
def run_id() -> int:
    experiment = create_experiment("faults", CONFIG)
    run = Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml=CONFIG
    )
    return run.pk


def job_status(run_id: int) -> str:
    return ray_jobs.state(Run.objects.get(pk=run_id).submission_id).status


def wait_for_job(run_id: int, statuses: set[str], timeout_s: float = 60) -> None:
    wait_until(lambda: job_status(run_id) in statuses, timeout_s, f"job in {statuses}", 0.5)


def submit_in_thread(run_id: int, monkeypatch, pause_before_ray: bool) -> tuple:
    """Run `submission.submit` in a thread that stops inside the Ray call (before or
    after Ray creates the job) until the test lets it go on."""
    paused, go_on, real_submit = threading.Event(), threading.Event(), ray_jobs.submit

    def submit_with_a_pause(*args, **kwargs):
        if pause_before_ray:
            paused.set()
            go_on.wait(60)
        started = real_submit(*args, **kwargs)
        if not pause_before_ray:
            paused.set()
            go_on.wait(60)
        return started

    monkeypatch.setattr(ray_jobs, "submit", submit_with_a_pause)
    errors: list[BaseException] = []

    def target() -> None:
        try:
            submission.submit(run_id)
        except BaseException as error:  # surfaced in the test's thread
            errors.append(error)

    thread = threading.Thread(target=target)
    thread.start()
    assert paused.wait(60), "the submission never reached Ray"
    return thread, go_on, errors


@pytest.mark.parametrize("pause_before_ray", [True, False], ids=["before-job", "after-job"])
def test_a_cancel_during_submission_never_leaves_a_job_running(
    ray, run_id, monkeypatch, pause_before_ray
):
    thread, go_on, errors = submit_in_thread(run_id, monkeypatch, pause_before_ray)
    assert Run.objects.get(pk=run_id).state == RunState.SUBMITTING
    cancellation.request_cancel(run_id, "cancelled by olga")
    assert Run.objects.get(pk=run_id).cancel_requested_at is not None  # intent stored
    cancellation.enforce_cancel(run_id)  # what the queued task does
    go_on.set()
    thread.join(60)
    assert not errors
    run = Run.objects.get(pk=run_id)
    assert run.state == RunState.CANCELLED and run.exit_reason == "cancelled by olga"
    wait_for_job(run_id, {"STOPPED"})
    jobs = [j for j in ray_jobs.client().list_jobs() if j.submission_id == run.submission_id]
    assert len(jobs) == 1
    reconcile.reconcile(run_id)
    assert Run.objects.get(pk=run_id).job_ended


def test_reconcile_stops_the_job_of_a_finished_run(ray, run_id):
    submission.submit(run_id)
    wait_for_job(run_id, {"RUNNING"})
    transition(run_id, RunState.FAILED, "marked failed elsewhere")  # its job lives on
    assert reconcile.runs_to_reconcile() == [run_id]
    reconcile.reconcile(run_id)
    wait_for_job(run_id, {"STOPPED"})
    reconcile.reconcile(run_id)
    assert reconcile.runs_to_reconcile() == []


def test_a_reconcile_pass_while_the_app_interrupts_its_runs_does_not_cancel_them(
    ray, run_id, monkeypatch
):
    """Ctrl-C on `./armature up` stops the jobs, then marks their runs interrupted; the
    worker's periodic reconcile may look at a run in between and find its job stopped."""
    submission.submit(run_id)
    wait_for_job(run_id, {"RUNNING"})
    reconcile.reconcile(run_id)
    real_wait = interruption._wait_for_jobs_to_end

    def reconcile_first(runs, wait_s):
        wait_for_job(run_id, {"STOPPED"})
        reconcile.reconcile(run_id)  # what the worker's beat does meanwhile
        return real_wait(runs, wait_s)

    monkeypatch.setattr(interruption, "_wait_for_jobs_to_end", reconcile_first)
    assert interruption.interrupt_active_runs("the app was stopped", 30) == [run_id]
    run = Run.objects.get(pk=run_id)
    assert run.state == RunState.INTERRUPTED and run.exit_reason == "the app was stopped"
    assert run.job_ended
    Run.objects.filter(pk=run_id).update(attempt=2)  # a resumed run's next attempt
    assert interruption.interrupt_reason(Run.objects.get(pk=run_id)) is None


def test_a_cancel_while_ray_is_unreachable_lands_when_ray_is_back(ray, run_id):
    submission.submit(run_id)
    wait_for_job(run_id, {"RUNNING"})
    reconcile.reconcile(run_id)
    ray.close()
    cancellation.request_cancel(run_id, "cancelled by olga")
    with pytest.raises(ray_jobs.RayUnavailable):  # the task retries on this
        cancellation.enforce_cancel(run_id)
    with pytest.raises(ray_jobs.RayUnavailable):
        reconcile.reconcile(run_id)
    run = Run.objects.get(pk=run_id)
    assert run.state == RunState.RUNNING and run.cancel_requested_at is not None
    ray.open()
    reconcile.reconcile(run_id)  # the periodic pass finds the pending cancel
    assert Run.objects.get(pk=run_id).state == RunState.CANCELLED
    wait_for_job(run_id, {"STOPPED"})


def test_a_cancel_ray_cannot_confirm_is_marked_with_its_reason_and_enforced_later(
    ray, run_id, settings
):
    submission.submit(run_id)
    wait_for_job(run_id, {"RUNNING"})
    ray.close()
    settings.ARMATURE_CANCEL_CONFIRM_S = 0
    cancellation.request_cancel(run_id)
    run = cancellation.enforce_cancel(run_id)
    assert run.state == RunState.CANCELLED and not run.job_ended
    assert "Ray has not answered" in run.exit_reason
    assert "stopped as soon as Ray answers" in run.exit_reason
    assert job_status_when_open(ray, run_id) == "RUNNING"  # not stopped yet: Ray was away
    reconcile.reconcile(run_id)
    wait_for_job(run_id, {"STOPPED"})


def job_status_when_open(gate: TcpGate, run_id: int) -> str:
    gate.open()
    return job_status(run_id)


def test_a_run_that_never_starts_in_ray_times_out_with_the_reason(ray, run_id, settings):
    run = transition(run_id, RunState.SUBMITTING)
    ray_jobs.client().submit_job(  # a job Ray cannot place: it stays PENDING
        entrypoint="sleep 600",
        submission_id=run.submission_id,
        entrypoint_resources={"robot_arm_that_is_not_there": 1},
    )
    Run.objects.filter(pk=run_id).update(job_ended=False)
    wait_for_job(run_id, {"PENDING"})
    assert reconcile.reconcile(run_id).state == RunState.SUBMITTING  # within the limit
    settings.ARMATURE_PENDING_TIMEOUT_S = 0
    run = reconcile.reconcile(run_id)
    assert run.state == RunState.TIMED_OUT
    assert "not started" in run.exit_reason and "job PENDING" in run.exit_reason
    assert "ARMATURE_PENDING_TIMEOUT_S" in run.exit_reason
    # Ray queues the stop until it can place the job (which then ends at once), or
    # fails it after its own start timeout; until then reconciliation keeps watching it.
    assert job_status(run_id) == "PENDING"
    assert reconcile.runs_to_reconcile() == [run_id]


def test_a_run_stuck_submitting_without_a_job_times_out(ray, run_id, settings):
    transition(run_id, RunState.SUBMITTING)
    settings.ARMATURE_PENDING_TIMEOUT_S = 0
    run = reconcile.reconcile(run_id)
    assert run.state == RunState.TIMED_OUT and "Ray has no job for it" in run.exit_reason


@pytest.fixture
def redis_layer(settings, tmp_path):
    """The channel layer on a Redis server of the test's own, so it can be stopped."""
    port = free_port()
    server = start(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
         "--appendonly", "no"],
        {}, tmp_path / "redis.log",
    )  # fmt: skip
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": f"redis://127.0.0.1:{port}"}]},
        }
    }
    yield server
    stop(server)


def test_redis_stopped_during_transitions_never_fails_the_request_or_the_task(
    ray, run_id, redis_layer, caplog
):
    from channels.layers import get_channel_layer

    wait_until(lambda: _layer_answers(get_channel_layer()), 30, "the test's Redis")
    stop(redis_layer)
    operator = get_user_model().objects.create_user("olga")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(operator)
    with caplog.at_level(logging.WARNING, logger="controlplane.runs.state"):
        assert api.post(f"/api/v1/runs/{run_id}/cancel").status_code == 202  # queued → final
        assert Run.objects.get(pk=run_id).state == RunState.CANCELLED

        experiment = Run.objects.get(pk=run_id).experiment
        other = Run.objects.create(
            experiment=experiment, revision=experiment.latest_revision, config_yaml=CONFIG
        )
        submission.submit(other.pk)
        cancellation.request_cancel(other.pk)
        result = tasks.cancel_run.apply(args=[other.pk])  # the task body, in this process
        assert result.successful() and result.get() == RunState.CANCELLED
    assert "could not tell" in caplog.text


def _layer_answers(layer) -> bool:
    from asgiref.sync import async_to_sync

    try:
        async_to_sync(layer.group_send)("probe", {"type": "probe"})
    except Exception:
        return False
    return True


def test_every_call_to_ray_has_a_deadline(settings):
    """A Ray dashboard that accepts connections and never answers."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    settings.RAY_ADDRESS = f"http://127.0.0.1:{silent.getsockname()[1]}"
    settings.RAY_REQUEST_TIMEOUT_S = 0.5
    try:
        for call in (
            lambda: ray_jobs.state("armature-run-1"),
            lambda: ray_jobs.stop("armature-run-1"),
            lambda: ray_jobs.log_tail("armature-run-1", 20, 4096),
            lambda: ray_jobs.log_stream("armature-run-1"),
            lambda: ray_jobs.submit("armature-run-1", "true", {}, {}),
        ):
            with pytest.raises(ray_jobs.RayUnavailable, match="unreachable"):
                call()
    finally:
        silent.close()
