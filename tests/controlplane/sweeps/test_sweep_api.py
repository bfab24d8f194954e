"""The sweeps API as a script uses it: a sweep refused at its keys (400, each problem at
its path and line), made once per Idempotency-Key, read with its trials best first and
the parameters' importances, cancelled, and its best trial written into a revision."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import metric_points
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from controlplane.sweeps.progress import advance

pytestmark = pytest.mark.django_db(transaction=True)  # Optuna's connections see commits

SPEC = """space:
  actor.learning_rate: {loguniform: [1.0e-4, 3.0e-3]}
  algorithm.clip_ratio: {uniform: [0.1, 0.3]}
objective: {metric: rollout/success_rate, last: 1}
budget: {trials: 2, parallel: 2}
sampler: random
"""


@pytest.fixture
def operator() -> APIClient:
    user = get_user_model().objects.create_user("otto")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    create_experiment("tuned", open("examples/builtin_ppo.yaml").read(), author=user)
    client = APIClient()
    client.force_authenticate(user)
    return client


def test_a_sweep_made_read_cancelled_and_its_best_trial_turned_into_a_revision(operator):
    bad = operator.post("/api/v1/sweeps/", {"experiment": "tuned", "spec": SPEC.replace(
        "1.0e-4, 3.0e-3", "3.0e-3, 1.0e-4")}, format="json")  # fmt: skip
    assert bad.status_code == 400
    (error,) = bad.json()["errors"]
    assert error["path"] == "space.actor.learning_rate" and "low bound" in error["message"]

    made = operator.post("/api/v1/sweeps/", {"experiment": "tuned", "spec": SPEC},
                         format="json", HTTP_IDEMPOTENCY_KEY="ci-7")  # fmt: skip
    assert made.status_code == 201, made.content
    sweep = made.json()
    assert sweep["state"] == "running" and sweep["revision"] == 1 and sweep["trials"] == []
    again = operator.post("/api/v1/sweeps", {"experiment": "tuned", "spec": SPEC},
                          format="json", HTTP_IDEMPOTENCY_KEY="ci-7")  # fmt: skip
    assert again.status_code == 200 and again.json()["id"] == sweep["id"]
    assert [s["id"] for s in operator.get("/api/v1/sweeps/").json()["results"]] == [sweep["id"]]

    advance(sweep["id"])
    for run, value in zip(Run.objects.order_by("pk"), (0.3, 0.7), strict=True):
        transition(run.pk, RunState.SUBMITTING)
        transition(run.pk, RunState.RUNNING)
        metric_points.store_points(run.pk, 1, 1.7e9, {"rollout/success_rate": value})
        transition(run.pk, RunState.SUCCEEDED)
    advance(sweep["id"])
    read = operator.get(f"/api/v1/sweeps/{sweep['id']}/").json()
    assert read["state"] == "finished"
    assert [trial["value"] for trial in read["trials"]] == [0.7, 0.3]  # best first
    assert read["best"]["value"] == 0.7 and read["best"]["run"] == read["trials"][0]["run"]
    assert set(read["importances"]) == {"actor.learning_rate", "algorithm.clip_ratio"}

    revision = operator.post(f"/api/v1/sweeps/{sweep['id']}/best-revision/")
    assert revision.status_code == 201 and revision.json()["number"] == 2
    assert operator.post(f"/api/v1/sweeps/{sweep['id']}/best-revision/").status_code == 200

    # The parts as JSON are the same sweep; both ways at once is refused.
    parts = {"space": {"actor.learning_rate": {"uniform": [1e-3, 2e-3]}},
             "objective": {"metric": "rollout/success_rate"}, "budget": {"trials": 1}}  # fmt: skip
    both = operator.post("/api/v1/sweeps/", {"experiment": "tuned", "spec": SPEC, **parts},
                         format="json")  # fmt: skip
    assert both.status_code == 400 and "either" in both.content.decode()
    other = operator.post("/api/v1/sweeps/", {"experiment": "tuned", **parts},
                          format="json").json()  # fmt: skip
    assert other["spec"]["budget"]["trials"] == 1 and "actor.learning_rate" in other["spec_yaml"]
    cancelled = operator.post(f"/api/v1/sweeps/{other['id']}/cancel/")
    assert cancelled.status_code == 202 and cancelled.json()["cancel_requested_at"]
    advance(other["id"])
    assert operator.get(f"/api/v1/sweeps/{other['id']}").json()["state"] == "cancelled"
