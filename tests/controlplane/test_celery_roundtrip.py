"""A task travels through the real broker to a real worker process and back."""

import time

import pytest

from controlplane.core.tasks import ping

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.embedded]


def test_it_round_trips_a_task_through_a_worker_process(stack_factory, settings):
    stack = stack_factory()
    stack.start_worker()
    sent_at = time.time()
    answer = ping.delay(sent_at).get(timeout=60)
    assert answer["sent_at"] == sent_at
    assert answer["answered_at"] >= sent_at


def test_a_worker_survives_a_burst_of_tasks(stack_factory):
    stack = stack_factory()
    stack.start_worker()
    results = [ping.delay(float(index)) for index in range(200)]
    answers = [result.get(timeout=120) for result in results]
    assert [answer["sent_at"] for answer in answers] == [float(i) for i in range(200)]
    assert stack.worker.poll() is None  # still running


def test_every_task_of_ours_has_soft_and_hard_time_limits():
    from controlplane.celery import app

    app.loader.import_default_modules()
    ours = {name: task for name, task in app.tasks.items() if not name.startswith("celery.")}
    assert {"core.ping", "runs.submit", "runs.cancel", "runs.reconcile"} <= ours.keys()
    for name, task in ours.items():
        assert task.soft_time_limit and task.time_limit > task.soft_time_limit, name


def test_run_tasks_retry_on_what_ray_really_raises():
    from controlplane.runs import tasks
    from controlplane.runs.ray_jobs import RayUnavailable

    for task in (tasks.submit_run, tasks.cancel_run):
        assert task.autoretry_for == (RayUnavailable,)
