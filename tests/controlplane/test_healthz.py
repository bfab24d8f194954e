"""/healthz reports every component and answers 503 when one is down."""

import pytest

from tests.processes import wait_until

pytestmark = pytest.mark.django_db(transaction=True)

COMPONENTS = {"database", "broker", "worker", "channel_layer", "ray"}


def test_it_is_200_when_every_component_is_up(client, settings, stack_factory, ray_head):
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


def test_it_is_503_naming_what_is_down(client, settings):
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


def test_it_reports_an_unreachable_broker(client, settings):
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
