"""A task travels through the real broker to a real worker process and back."""

import time

import pytest

from controlplane.core.tasks import ping

pytestmark = pytest.mark.django_db(transaction=True)


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
