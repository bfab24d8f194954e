"""/healthz reports every component and answers 503 when one is down. Anonymous callers
learn only up or down; the details need a login. However often it is asked, it measures
(and so sends a Celery ping) at most about once a second."""

import asyncio
import time

import pytest
from celery.signals import before_task_publish
from django.contrib.auth import get_user_model

from controlplane.core import health
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.embedded]

COMPONENTS = {"database", "broker", "worker", "channel_layer", "ray"}


@pytest.fixture(autouse=True)
def fresh_measurement():
    health.shared_status.forget()  # a measurement from another test says nothing here
    yield
    health.shared_status.forget()


@pytest.fixture
def user_client(client):
    client.force_login(get_user_model().objects.create_user("hal"))
    return client


def test_it_is_200_when_every_component_is_up(user_client, settings, stack_factory, ray_head):
    client = user_client
    settings.RAY_ADDRESS = ray_head.url
    stack = stack_factory()
    stack.start_worker()
    responses = []

    def all_up() -> bool:
        responses.append(client.get("/healthz"))
        return responses[-1].status_code == 200

    wait_until(all_up, 60, "every component up", poll_s=1)
    report = responses[-1].json()
    assert report["status"] == "up"
    assert set(report["checks"]) == COMPONENTS
    assert all(check["up"] for check in report["checks"].values())
    assert all(check["latency_ms"] >= 0 for check in report["checks"].values())
    assert report["checks"]["ray"]["info"]["nodes"] == 1
    assert report["checks"]["ray"]["info"]["cpus"] == 2


def test_it_is_503_naming_what_is_down(user_client, settings):
    client = user_client
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # nothing listens there; no worker runs
    response = client.get("/healthz")
    assert response.status_code == 503
    report = response.json()
    assert report["status"] == "down"
    assert report["checks"]["database"]["up"] is True
    assert report["checks"]["broker"]["up"] is True
    assert report["checks"]["channel_layer"]["up"] is True
    assert report["checks"]["ray"]["up"] is False
    assert "127.0.0.1:9" in report["checks"]["ray"]["detail"]
    assert report["checks"]["worker"]["up"] is False
    assert "no worker answered" in report["checks"]["worker"]["detail"]


def test_it_reports_an_unreachable_broker(user_client, settings):
    client = user_client
    from controlplane.celery import app

    original = app.conf.broker_url, app.conf.broker_transport
    app.conf.broker_url, app.conf.broker_transport = "redis://127.0.0.1:9/0", None
    try:
        report = client.get("/healthz").json()
    finally:
        app.conf.broker_url, app.conf.broker_transport = original
    assert report["checks"]["broker"]["up"] is False
    assert report["checks"]["worker"] == {
        "up": False, "latency_ms": None, "detail": "broker unreachable", "info": {},
    }  # fmt: skip


def test_anonymous_callers_learn_only_up_or_down(client, settings):
    settings.RAY_ADDRESS = "http://127.0.0.1:9"
    response = client.get("/healthz")
    assert response.status_code == 503
    report = response.json()
    assert report["status"] == "down"
    assert set(report["checks"]) == COMPONENTS
    assert all(set(check) == {"up"} for check in report["checks"].values())
    assert report["checks"]["database"] == {"up": True}
    assert report["checks"]["ray"] == {"up": False}
    assert "127.0.0.1:9" not in response.content.decode()


@pytest.fixture
def pings_sent():
    sent = []

    def count(sender: str, **kwargs) -> None:
        if sender == "core.ping":
            sent.append(time.monotonic())

    before_task_publish.connect(count, weak=False)
    yield sent
    before_task_publish.disconnect(count)


async def test_a_flood_of_requests_sends_one_ping(async_client, settings, pings_sent):
    settings.RAY_ADDRESS = "http://127.0.0.1:9"
    # Longer than the default, so a slow machine still asks again within the window.
    health.shared_status.max_age_s = 3.0
    try:
        together = await asyncio.gather(*(async_client.get("/healthz") for _ in range(20)))
        after = [await async_client.get("/healthz") for _ in range(10)]
        assert {r.status_code for r in together + after} == {503}  # no worker runs here
        assert len(pings_sent) == 1
        await asyncio.sleep(health.shared_status.max_age_s)
        await async_client.get("/healthz")
        assert len(pings_sent) == 2  # measured again once the last one is old
    finally:
        health.shared_status.max_age_s = health.STATUS_MAX_AGE_S
