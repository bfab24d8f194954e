"""End to end on real components: a run of the built-in env trains through the Celery
worker and Ray, then an eval run of its checkpoint goes the same way — a Ray job running
`python -m trainer eval` that reports over the link to the live web server — and its
table is read back from the API, the run's files and the pages."""

import json

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import artifacts, ray_jobs
from controlplane.runs.models import Run, RunState
from tests.processes import wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(400)]

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
TRAIN = ["runner.iterations=12", "runner.checkpoint_every=6"]


@pytest.fixture
def live(stack_factory, ray_head, settings):
    settings.RAY_ADDRESS = ray_head.url
    stack = stack_factory(RAY_ADDRESS=ray_head.url)
    stack.start_worker()
    stack.start_web()  # the trainers' links report to it as they go
    create_experiment("demo", CONFIG)
    user = get_user_model().objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    api = APIClient()
    api.force_authenticate(user)
    page = Client()
    page.force_login(user)
    return api, page


def finished(run_id: int, timeout_s: float = 240) -> Run:
    wait_until(lambda: Run.objects.get(pk=run_id).is_final, timeout_s, f"run {run_id} to end", 0.5)
    return Run.objects.get(pk=run_id)


def test_an_eval_run_of_a_trained_run_reports_its_table_to_the_api_and_the_pages(live):
    api, page = live
    source_id = api.post("/api/v1/runs", {"experiment": "demo", "overrides": TRAIN},
                         format="json").json()["id"]  # fmt: skip
    source = finished(source_id)
    assert source.state == RunState.SUCCEEDED, source.exit_reason
    assert sorted(artifacts.checkpoints(source.pk)) == [6, 12]

    asked = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"tasks": [0, 3], "states": 4},
                     format="json")  # fmt: skip
    assert asked.status_code == 201, asked.json()
    run = finished(asked.json()["id"])
    assert run.state == RunState.SUCCEEDED, run.exit_reason
    assert run.exit_reason == "the trainer finished"  # its own word, over the live link
    assert (run.progress_step, run.progress_total) == (2, 2)
    kinds = list(run.events.values_list("kind", flat=True))
    for kind in ("launched", "submitted", "started", "evaluated", "finished"):
        assert kind in kinds, kinds
    job = next(j for j in ray_jobs.client().list_jobs() if j.submission_id == run.submission_id)
    eval_folder = str(artifacts.run_artifact_dir(run.pk).resolve())
    assert " -m trainer eval " in job.entrypoint and f"--output {eval_folder}" in job.entrypoint
    assert "iter_000012.pt" in job.entrypoint

    answer = api.get(f"/api/v1/runs/{run.pk}/evaluation").json()
    table = answer["table"]
    assert (answer["source_run"], answer["checkpoint"], table["iteration"]) == (source.pk, 12, 12)
    assert table["checkpoint"].endswith(f"run-{source.pk}/checkpoints/iter_000012.pt")
    assert table["horizons"] == [5, 10, 15]
    assert [(t["task_id"], t["name"], t["episodes"]) for t in table["tasks"]] == [
        (0, "reach_red", 12), (3, "grasp_red", 12),  # 4 states x 3 horizons
    ]  # fmt: skip
    assert table["average"] == pytest.approx(sum(t["rate"] for t in table["tasks"]) / 2)
    written = artifacts.run_artifact_dir(run.pk) / "eval-builtin_reach-iter12.json"
    assert json.loads(written.read_text()) == table  # the file and the message agree
    files = [f["path"] for f in api.get(f"/api/v1/runs/{run.pk}/artifacts").json()]
    assert "eval-builtin_reach-iter12.md" in files
    assert run.summary["eval/success_rate"] == pytest.approx(table["average"])

    eval_page = page.get(f"/runs/{run.pk}/").content.decode()
    for task in table["tasks"]:
        row = eval_page.split(f'<tr data-task="{task["task_id"]}">')[1].split("</tr>")[0]
        assert f"{task['successes']} / 12" in row and f"{task['rate']:.3f}" in row
    footer = eval_page.split('<tr data-task="average">')[1].split("</tr>")[0]
    assert f"{table['average']:.3f}" in footer
    listed = api.get(f"/api/v1/runs/{source.pk}/evaluations").json()["results"]
    assert [(e["id"], e["checkpoint"], e["average"]) for e in listed] == [
        (run.pk, 12, table["average"])
    ]
    source_page = page.get(f"/runs/{source.pk}/").content.decode()
    assert f'<tr data-run="{run.pk}" data-state="succeeded">' in source_page
