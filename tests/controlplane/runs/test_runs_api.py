"""REST: experiments, revisions and runs (launch with an idempotency key, filters,
roles, bad payloads)."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


def client_with_role(username: str, role: str | None) -> APIClient:
    user = get_user_model().objects.create_user(username)
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def operator():
    return client_with_role("olga", "operator")


@pytest.fixture
def experiment(operator):
    response = operator.post(
        "/api/v1/experiments", {"name": "demo", "config_yaml": CONFIG, "tags": ["t"]}, format="json"
    )
    assert response.status_code == 201, response.json()
    return response.json()


def test_experiments_and_revisions(operator, experiment):
    assert experiment["latest_revision"]["number"] == 1
    changed = CONFIG.replace("seed: 0", "seed: 3")
    added = operator.post(
        "/api/v1/experiments/demo/revisions", {"config_yaml": changed}, format="json"
    )
    assert (added.status_code, added.json()["number"]) == (201, 2)
    same = operator.post(
        "/api/v1/experiments/demo/revisions", {"config_yaml": changed}, format="json"
    )
    assert (same.status_code, same.json()["number"]) == (200, 2)
    listed = operator.get("/api/v1/experiments/demo/revisions").json()["results"]
    assert [r["number"] for r in listed] == [2, 1]
    assert operator.get("/api/v1/experiments/nope").status_code == 404


def test_invalid_configs_answer_400_with_key_paths(operator):
    response = operator.post(
        "/api/v1/experiments",
        {"name": "bad", "config_yaml": "runner:\n  iterations: -1\n"},
        format="json",
    )
    assert response.status_code == 400
    assert response.json()["errors"][0]["path"] == "runner.iterations"


def test_launch_is_idempotent_per_key(operator, experiment):
    body = {"experiment": "demo", "overrides": ["runner.iterations=3"]}
    first = operator.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="ci-42")
    again = operator.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="ci-42")
    other = operator.post("/api/v1/runs", body, format="json", HTTP_IDEMPOTENCY_KEY="ci-43")
    assert (first.status_code, again.status_code, other.status_code) == (201, 200, 201)
    assert first.json()["id"] == again.json()["id"] != other.json()["id"]
    assert Run.objects.count() == 2
    run = first.json()
    assert (run["state"], run["progress_total"], run["revision"]) == ("queued", 3, 1)
    assert "iterations: 3" in Run.objects.get(pk=run["id"]).config_yaml


def test_runs_are_listed_filtered_and_shown(operator, experiment):
    run_id = operator.post("/api/v1/runs", {"experiment": "demo"}, format="json").json()["id"]
    assert [r["id"] for r in operator.get("/api/v1/runs?state=queued").json()["results"]] == [
        run_id
    ]
    assert operator.get("/api/v1/runs?state=running").json()["results"] == []
    assert operator.get("/api/v1/runs?state=bogus").status_code == 400
    assert operator.get(f"/api/v1/runs/{run_id}").json()["experiment"] == "demo"
    assert operator.get(f"/api/v1/runs/{run_id}/events").json()["results"][0]["kind"] == "launched"
    assert operator.get(f"/api/v1/runs/{run_id}/metrics").json() == {"latest": {}}
    assert operator.get("/api/v1/runs/999999").status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"experiment": "demo", "overrides": ["no-equals-sign"]},
        {"experiment": "demo", "overrides": "runner.iterations=3"},
        {"experiment": "demo", "timeout_s": 0},
        {"experiment": "demo", "overrides": ["runner.iterations=-5"]},
    ],
)
def test_bad_launches_answer_400(operator, experiment, body):
    response = operator.post("/api/v1/runs", body, format="json")
    assert response.status_code == 400, response.json()


def test_unknown_experiment_revision_or_cluster_is_404(operator, experiment):
    for body in (
        {"experiment": "nope"},
        {"experiment": "demo", "revision": 9},
        {"experiment": "demo", "cluster": "nope"},
    ):
        assert operator.post("/api/v1/runs", body, format="json").status_code == 404


def test_viewers_cannot_launch_or_cancel(operator, experiment):
    run_id = operator.post("/api/v1/runs", {"experiment": "demo"}, format="json").json()["id"]
    viewer = client_with_role("vic", None)
    assert viewer.get("/api/v1/runs").status_code == 200
    assert viewer.post("/api/v1/runs", {"experiment": "demo"}, format="json").status_code == 403
    assert viewer.post(f"/api/v1/runs/{run_id}/cancel").status_code == 403
    assert (
        viewer.post(
            "/api/v1/experiments", {"name": "x", "config_yaml": CONFIG}, format="json"
        ).status_code
        == 403
    )
