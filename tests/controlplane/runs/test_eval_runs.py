"""Eval runs: evaluating a run's checkpoint from the API and the run page, what a request
may ask (every bad field named, never a 500), who may launch one, the Ray job's command,
the lifecycle a trainer's reports drive, and where the table shows (the eval run's page
and API, the source run's evaluations, the compare page)."""

import shlex
import sys

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import artifacts, submission, telemetry
from controlplane.runs.cancellation import request_cancel
from controlplane.runs.evaluations import (
    EvalRequest,
    EvaluationRefused,
    request_evaluation,
)
from controlplane.runs.models import Run, RunKind, RunState
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from trainer.evaluation.protocol import EvalTable, TaskResult
from trainer.link import protocol
from trainer.link.reporter import eval_summary

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
LIBERO = "name: libero-ppo\nenv:\n  name: libero\n  suite: libero_spatial\n"


def user_with_role(username: str, role: str | None):
    user = get_user_model().objects.create_user(username)
    if role:
        user.groups.add(Group.objects.get_or_create(name=role)[0])
    return user


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture(autouse=True)
def own_artifacts(settings, tmp_path):
    settings.ARTIFACTS_DIR = tmp_path / "artifacts"


@pytest.fixture
def operator():
    return user_with_role("olga", "operator")


@pytest.fixture
def api(operator) -> APIClient:
    return api_as(operator)


def finished_run(name: str = "demo", config: str = CONFIG, checkpoints=(2, 4)) -> Run:
    """A training run that succeeded, with checkpoint files of these iterations (the
    control plane only lists them; the trainer reads them)."""
    experiment = create_experiment(name, config)
    run = Run.objects.create(
        experiment=experiment, revision=experiment.latest_revision, config_yaml=config
    )
    for state in (RunState.SUBMITTING, RunState.RUNNING, RunState.SUCCEEDED):
        transition(run.pk, state)
    for iteration in checkpoints:
        path = artifacts.checkpoint_path(run.pk, iteration)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"a checkpoint")
    run.refresh_from_db()
    return run


@pytest.fixture
def source() -> Run:
    return finished_run()


def table(iteration: int, rates: dict[int, tuple[int, int]], checkpoint: str = "c.pt") -> dict:
    """The eval table the trainer writes (trainer.evaluation.protocol.EvalTable) with
    {task: (successes at H=5, at H=10)} of 4 episodes each."""
    results = [
        TaskResult(task, f"task_{task}", 8, h5 + h10, {5: [h5, 4], 10: [h10, 4]})
        for task, (h5, h10) in rates.items()
    ]
    return EvalTable("builtin_reach", None, checkpoint, iteration, [5, 10], results).to_json()


def report(run: Run, *messages: protocol.Event | protocol.Progress) -> None:
    """What the eval run's trainer sends over its link, stored as the link stores it."""
    for message in messages:
        telemetry.record(run.pk, telemetry.parse_message(message.payload()), run.attempt)


def evaluated(run: Run, data: dict) -> None:
    report(
        run,
        protocol.Event(seq=1, kind="started", data={"mode": "eval"}),
        protocol.Progress(seq=2, step=len(data["tasks"]), total=len(data["tasks"])),
        protocol.Event(seq=3, kind="evaluated", data=data),
        protocol.Event(seq=4, kind="finished", data={"summary": eval_summary(data)}),
    )


def test_evaluate_queues_an_eval_run_whose_job_runs_trainer_eval_on_the_checkpoint(api, source):
    reply = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"tasks": [0, 1], "states": 4},
                     format="json")  # fmt: skip
    assert reply.status_code == 201, reply.json()
    body = reply.json()
    assert (body["kind"], body["source_run"], body["source_iteration"]) == ("eval", source.pk, 4)
    assert body["eval_options"] == {"suite": None, "tasks": [0, 1], "states": 4}
    assert (body["state"], body["progress_total"], body["experiment"]) == ("queued", 2, "demo")
    run = Run.objects.get(pk=body["id"])
    assert run.config_yaml == source.config_yaml and run.created_by.username == "olga"
    checkpoint = artifacts.checkpoint_path(source.pk, 4).resolve()
    assert submission.entrypoint(run) == shlex.join([
        sys.executable, "-m", "trainer", "eval", str(checkpoint), "--config", "config.yaml",
        "--output", str(artifacts.run_artifact_dir(run.pk).resolve()),
        "--tasks", "0,1", "--states", "4",
    ])  # fmt: skip
    older = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"checkpoint": 2}, format="json")
    assert older.json()["source_iteration"] == 2 and older.json()["progress_total"] == 6
    command = shlex.split(submission.entrypoint(Run.objects.get(pk=older.json()["id"])))
    assert command[4].endswith("checkpoints/iter_000002.pt") and "--tasks" not in command


@pytest.mark.parametrize(
    ("body", "problems"),
    [
        ({"tasks": [0, 9, 12]}, {"tasks": "builtin_reach has tasks 0..5; not 9, 12"}),
        ({"tasks": [-1]}, {"tasks": "not task ids: -1"}),
        ({"tasks": [1, 1]}, {"tasks": "listed twice: 1"}),
        ({"tasks": []}, {"tasks": "lists no task"}),
        ({"tasks": ["a"]}, {"tasks": "A valid integer is required"}),
        ({"tasks": "0,1"}, {"tasks": 'Expected a list of items but got type "str"'}),
        ({"states": 0}, {"states": "must be at least 1, not 0"}),
        ({"states": -3}, {"states": "must be at least 1, not -3"}),
        ({"states": 51}, {"states": "builtin_reach has 50 init states per task; at most 50"}),
        ({"states": "many"}, {"states": "A valid integer is required"}),
        ({"states": True}, {"states": "A valid integer is required"}),
        ({"checkpoint": 3}, {"checkpoint": "has no checkpoint of iteration 3; it has 2, 4"}),
        ({"checkpoint": -1}, {"checkpoint": "greater than or equal to 0"}),
        ({"suite": "libero_goal"}, {"suite": "builtin_reach has no suites"}),
        ({"tasks": [7], "states": 0, "checkpoint": 5},
         {"tasks": "not 7", "states": "at least 1", "checkpoint": "iteration 5"}),
    ],
)  # fmt: skip
def test_a_bad_request_answers_400_naming_each_field(api, source, body, problems):
    reply = api.post(f"/api/v1/runs/{source.pk}/evaluate", body, format="json")
    assert reply.status_code == 400
    answer = reply.json()
    assert set(answer) == set(problems)
    for field, text in problems.items():
        assert text in str(answer[field]), answer
    assert not Run.objects.filter(kind=RunKind.EVAL).exists()


def test_a_run_without_checkpoints_and_an_eval_run_cannot_be_evaluated(api):
    young = finished_run("young", checkpoints=())
    reply = api.post(f"/api/v1/runs/{young.pk}/evaluate", {}, format="json")
    assert reply.status_code == 400
    assert f"run {young.pk} has no checkpoint yet" in reply.json()["checkpoint"][0]
    source = finished_run("old")
    eval_id = api.post(f"/api/v1/runs/{source.pk}/evaluate", {}, format="json").json()["id"]
    again = api.post(f"/api/v1/runs/{eval_id}/evaluate", {}, format="json")
    assert again.status_code == 400
    assert again.json() == {"run": [f"run {eval_id} is an evaluation; evaluate a training run "
                                    f"(run {source.pk} is the one it evaluates)"]}  # fmt: skip
    assert api.post("/api/v1/runs/999999/evaluate", {}, format="json").status_code == 404


def test_an_rlpd_run_is_evaluated_like_any_other(api, client, operator):
    rlpd = (settings.BASE_DIR / "examples/builtin_rlpd.yaml").read_text()
    split = "cluster: {num_nodes: 2, component_placement: {actor: '0', env: '0-1'}}\n"
    run = finished_run("rlpd", config=rlpd + split)
    client.force_login(operator)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="evaluate-form"' in page
    reply = api.post(f"/api/v1/runs/{run.pk}/evaluate", {"checkpoint": 4}, format="json")
    assert reply.status_code == 201, reply.json()
    evaluation = Run.objects.get(pk=reply.json()["id"])
    assert evaluation.kind == RunKind.EVAL and evaluation.source_run_id == run.pk
    # The evaluation is one process, whatever the source run's placement.
    page = client.get(f"/runs/{evaluation.pk}/").content.decode()
    table = page[page.index('id="run-processes"') :]
    assert table.count("<tr data-component=") == 1 and 'data-component="actor"' in table


def test_libero_runs_choose_a_suite_with_as_many_tasks(api):
    source = finished_run("libero", LIBERO)
    refused = api.post(f"/api/v1/runs/{source.pk}/evaluate",
                       {"suite": "libero_90", "tasks": [12]}, format="json")  # fmt: skip
    assert refused.status_code == 400
    why = refused.json()["suite"][0]
    assert "libero_90 has 90 tasks; the policy was trained on libero_spatial's 10" in why
    assert "tasks" not in refused.json()  # 12 is a task of libero_90
    unknown = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"suite": "libero_100"}, format="json")
    assert "unknown LIBERO suite 'libero_100'" in unknown.json()["suite"][0]
    body = {"suite": "libero_goal", "tasks": [9], "states": 50}
    goal = api.post(f"/api/v1/runs/{source.pk}/evaluate", body, format="json")
    assert goal.status_code == 201, goal.json()
    command = shlex.split(submission.entrypoint(Run.objects.get(pk=goal.json()["id"])))
    assert command[-6:] == ["--suite", "libero_goal", "--tasks", "9", "--states", "50"]
    too_many = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"tasks": [10]}, format="json")
    assert too_many.json() == {"tasks": ["libero has tasks 0..9; not 10"]}


def test_a_named_suite_is_evaluated_whole_the_runs_own_suite_on_its_tasks(api):
    source = finished_run("libero-two", LIBERO + "  task_ids: [0, 1]\n")
    own = api.post(f"/api/v1/runs/{source.pk}/evaluate", {}, format="json")
    assert own.json()["progress_total"] == 2  # the run's tasks
    goal = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"suite": "libero_goal"}, format="json")
    assert goal.json()["progress_total"] == 10  # every task of the suite (the protocol)


def test_only_operators_and_admins_may_evaluate_at_either_door(source):
    callers = {
        "anonymous": None,
        "viewer": user_with_role("vic", None),
        "operator": user_with_role("olga", "operator"),
        "admin": user_with_role("ada", "admin"),
    }
    answers = {}
    for name, user in callers.items():
        api, page = APIClient(), Client()
        if user is not None:
            api.force_authenticate(user)
            page.force_login(user)
        reply = api.post(f"/api/v1/runs/{source.pk}/evaluate", {"states": 2}, format="json")
        form = page.post(f"/runs/{source.pk}/evaluate/", {"states": "2"})
        where = form.get("Location", "")
        went = "login" if where.startswith("/login/") else "run page" if where else ""
        answers[name] = (reply.status_code, form.status_code, went)
    token = APIClient(HTTP_AUTHORIZATION=f"Bearer {make_run_token(source.pk)}")
    answers["run token"] = token.post(f"/api/v1/runs/{source.pk}/evaluate", {}).status_code
    assert answers == {
        "anonymous": (401, 302, "login"),
        "viewer": (403, 403, ""),
        "operator": (201, 302, "run page"),
        "admin": (201, 302, "run page"),
        "run token": 401,
    }
    eval_runs = Run.objects.filter(kind=RunKind.EVAL).order_by("pk")
    assert [run.created_by.username for run in eval_runs] == ["olga", "olga", "ada", "ada"]


def test_an_idempotency_key_gives_back_the_same_eval_run(api, source):
    headers = {"HTTP_IDEMPOTENCY_KEY": "eval-once"}
    first = api.post(f"/api/v1/runs/{source.pk}/evaluate", {}, format="json", **headers)
    second = api.post(f"/api/v1/runs/{source.pk}/evaluate", {}, format="json", **headers)
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert Run.objects.filter(kind=RunKind.EVAL).count() == 1


def test_the_trainers_reports_move_the_eval_run_and_store_its_table(api, source):
    run = Run.objects.get(pk=api.post(f"/api/v1/runs/{source.pk}/evaluate", {"tasks": [0, 1]},
                                      format="json").json()["id"])  # fmt: skip
    transition(run.pk, RunState.SUBMITTING)
    waiting = api.get(f"/api/v1/runs/{run.pk}/evaluation").json()
    assert waiting == {
        "run": run.pk, "source_run": source.pk, "checkpoint": 4, "state": "submitting",
        "options": run.eval_options, "table": None,
    }  # fmt: skip
    data = table(4, {0: (4, 3), 1: (1, 0)})
    evaluated(Run.objects.get(pk=run.pk), data)
    run.refresh_from_db()
    assert run.state == RunState.SUCCEEDED and run.progress_step == 2
    assert run.summary["eval/success_rate"] == pytest.approx((7 / 8 + 1 / 8) / 2)
    assert api.get(f"/api/v1/runs/{run.pk}/evaluation").json()["table"] == data
    listed = api.get(f"/api/v1/runs/{source.pk}/evaluations").json()["results"]
    assert [(e["id"], e["state"], e["checkpoint"], e["env"], e["tasks"]) for e in listed] == [
        (run.pk, "succeeded", 4, "builtin_reach", [0, 1])
    ]
    assert listed[0]["average"] == pytest.approx(0.5)
    assert listed[0]["horizon_average"] == {"5": 0.625, "10": 0.375}
    training = api.get(f"/api/v1/runs/{source.pk}/evaluation")
    assert training.status_code == 404 and "/evaluations" in training.json()["detail"]
    kinds = api.get("/api/v1/runs", {"kind": "eval"}).json()["results"]
    assert [r["id"] for r in kinds] == [run.pk]
    assert api.get("/api/v1/runs", {"kind": "test"}).status_code == 400


def test_an_eval_run_fails_on_its_trainers_word_and_cancels_like_any_run(api, source):
    first, second = (
        Run.objects.get(pk=api.post(f"/api/v1/runs/{source.pk}/evaluate", {},
                                    format="json").json()["id"])
        for _ in range(2)
    )  # fmt: skip
    transition(first.pk, RunState.SUBMITTING)
    error = "ConfigError: --tasks: builtin_reach has tasks 0..5, not 6"
    report(first, protocol.Event(seq=1, kind="failed", data={"error": error}))
    first.refresh_from_db()
    assert (first.state, first.exit_reason) == (RunState.FAILED, error)
    assert request_cancel(second.pk, "cancelled by olga").state == RunState.CANCELLED


def test_the_pages_show_the_table_the_evaluations_and_the_form(client, operator, source):
    client.force_login(operator)
    page = client.get(f"/runs/{source.pk}/").content.decode()
    assert 'id="evaluate-form"' in page and ">iter 4</option>" in page
    assert "Not evaluated yet." in page
    first, second = (
        request_evaluation(source, EvalRequest(checkpoint=it), user=operator)[0] for it in (2, 4)
    )
    for run, rates in ((first, {0: (0, 1), 1: (2, 2)}), (second, {0: (4, 4), 1: (3, 4)})):
        transition(run.pk, RunState.SUBMITTING)
        evaluated(run, table(run.source_iteration, rates))
    eval_page = client.get(f"/runs/{second.pk}/").content.decode()
    assert 'id="eval-table"' in eval_page and "run_page.js" not in eval_page
    row = eval_page.split('<tr data-task="1">')[1].split("</tr>")[0]
    assert "7 / 8" in row and "0.875" in row and "0.750" in row and "1.000" in row
    footer = eval_page.split('<tr data-task="average">')[1].split("</tr>")[0]
    assert "15 / 16" in footer and "0.938" in footer
    source_page = client.get(f"/runs/{source.pk}/").content.decode()
    listed = source_page.split('id="evaluation-list"')[1].split("</table>")[0]
    assert listed.index(f"run {second.pk}") < listed.index(f"run {first.pk}")  # newest first
    assert "0.938" in listed and "0.313" in listed
    side = source_page.split('class="eval-compare"')[1].split("</figure>")[0]
    assert side.index("iter 2") < side.index("iter 4")  # checkpoints in training order
    task_0 = side.split('<tr data-task="0">')[1].split("</tr>")[0]
    assert "0.125" in task_0 and "1/8" in task_0 and "1.000" in task_0 and "8/8" in task_0
    viewer = Client()
    viewer.force_login(user_with_role("vic", None))
    assert 'id="evaluate-form"' not in viewer.get(f"/runs/{source.pk}/").content.decode()


def test_a_refused_form_shows_the_page_again_with_what_is_wrong(client, operator, source):
    client.force_login(operator)
    refused = client.post(f"/runs/{source.pk}/evaluate/", {"tasks": "0, 8", "states": "0"})
    assert refused.status_code == 422
    page = refused.content.decode()
    assert "builtin_reach has tasks 0..5; not 8" in page and "must be at least 1, not 0" in page
    assert 'value="0, 8"' in page  # the form as it was filled in
    typo = client.post(f"/runs/{source.pk}/evaluate/", {"tasks": "0;1"})
    assert typo.status_code == 422 and "not task ids: 0;1" in typo.content.decode()
    done = client.post(f"/runs/{source.pk}/evaluate/", {"checkpoint": "2", "tasks": "3"})
    run = Run.objects.get(kind=RunKind.EVAL)
    assert done.status_code == 302 and done["Location"] == f"/runs/{run.pk}/"
    assert (run.source_iteration, run.eval_options["tasks"]) == (2, [3])
    waiting = client.get(done["Location"]).content.decode()
    assert 'id="eval-waiting"' in waiting and "tasks 3" in waiting
    again = client.post(f"/runs/{run.pk}/evaluate/", {}, follow=True)
    assert f"run {run.pk} is an evaluation; evaluate a training run" in again.content.decode()
    young = finished_run("young", checkpoints=())
    note = client.get(f"/runs/{young.pk}/").content.decode()
    assert "once the run has saved a checkpoint" in note and 'id="evaluate-form"' not in note


def test_compare_puts_the_runs_evaluations_side_by_side(client, operator, source):
    client.force_login(operator)
    other = finished_run("other")
    plain = finished_run("plain", checkpoints=())
    runs = {}
    for run_source, iteration, rates in ((source, 2, {0: (0, 0)}), (source, 4, {0: (4, 2)}),
                                         (other, 4, {0: (1, 1), 3: (2, 2)})):  # fmt: skip
        run = request_evaluation(run_source, EvalRequest(checkpoint=iteration), user=operator)[0]
        transition(run.pk, RunState.SUBMITTING)
        evaluated(run, table(iteration, rates))
        runs[(run_source.pk, iteration)] = run
    lone = runs[(other.pk, 4)]
    page = client.get(f"/runs/compare/?ids={source.pk},{lone.pk},{plain.pk}").content.decode()
    section = page.split('id="compare-evaluations"')[1].split("</section>")[0]
    heads = section.split("<thead>")[1].split("</thead>")[0]
    newest = runs[(source.pk, 4)]
    assert heads.index(f"run {source.pk}") < heads.index(f"run {lone.pk}")
    assert f"iter 4 · eval run {newest.pk}" in heads and f"run {other.pk} at iter 4" in heads
    assert f"run {plain.pk}" not in heads  # no evaluation: no column
    task_0 = section.split('<tr data-task="0">')[1].split("</tr>")[0]
    assert "0.750" in task_0 and "6/8" in task_0 and "0.250" in task_0
    task_3 = section.split('<tr data-task="3">')[1].split("</tr>")[0]
    assert "—" in task_3 and "0.500" in task_3  # the first run has no task 3
    averages = section.split('<tr data-task="average">')[1].split("</tr>")[0]
    assert "0.750" in averages and "0.375" in averages
    assert '<tr data-horizon="5">' in section and '<tr data-horizon="10">' in section
    none = client.get(f"/runs/compare/?ids={plain.pk},{finished_run('x').pk}").content.decode()
    assert "None of these runs has a finished evaluation" in none


def test_the_service_refuses_with_every_problem_at_once(operator, source):
    with pytest.raises(EvaluationRefused) as refused:
        request_evaluation(source, EvalRequest(checkpoint=1, tasks=[6], states=0), user=operator)
    assert set(refused.value.problems) == {"checkpoint", "tasks", "states"}
