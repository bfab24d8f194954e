"""Experiment and run pages: create, revise with validation, diff, clone, launch, list
with filters, run page, stop, config diff, and role checks."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.experiments.models import Experiment
from controlplane.experiments.services import create_experiment
from controlplane.inventory.services import import_cluster_yaml
from controlplane.runs import metric_points
from controlplane.runs.launch import launch_run
from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


@pytest.fixture
def operator(client):
    user = get_user_model().objects.create_user("olga")
    user.groups.add(Group.objects.get_or_create(name="operator")[0])
    client.force_login(user)
    client.user = user
    return client


def test_create_revise_diff_and_clone(operator):
    created = operator.post(
        "/experiments/", {"name": "demo", "config_yaml": CONFIG, "tags": "a, b"}
    )
    assert created["Location"] == "/experiments/demo/"
    assert Experiment.objects.get(name="demo").tags == ["a", "b"]
    changed = CONFIG.replace("seed: 0", "seed: 9")
    assert operator.post("/experiments/demo/", {"config_yaml": changed}).status_code == 302
    diff = operator.get("/experiments/demo/diff/?r=1&r=2").content.decode()
    assert "-  seed: 0" in diff and "+  seed: 9" in diff
    assert operator.post("/experiments/demo/clone/", {"name": "demo-2"})["Location"] == (
        "/experiments/demo-2/"
    )


def test_invalid_configs_are_shown_with_their_key_paths(operator):
    page = operator.post("/experiments/", {"name": "bad", "config_yaml": "runner: {iterations: 0}"})
    assert "runner.iterations" in page.content.decode()
    assert not Experiment.objects.filter(name="bad").exists()
    checked = operator.post("/experiments/validate/", {"config_yaml": "algorithm: {name: x}"})
    assert "algorithm.name" in checked.content.decode()


def test_config_problems_point_at_their_yaml_line(operator):
    text = CONFIG.replace("iterations: 60", "iterations: -3")
    line = next(n for n, row in enumerate(text.splitlines(), 1) if "iterations: -3" in row)
    checked = operator.post("/experiments/validate/", {"config_yaml": text}).content.decode()
    assert f'<li data-line="{line}">' in checked and f"line {line}</span>" in checked
    broken = operator.post("/experiments/validate/", {"config_yaml": "a: 1\nb: [2\n"})
    assert 'data-line="3"' in broken.content.decode()  # the syntax error's own line
    create_experiment("demo", CONFIG)
    api = operator.post(
        "/api/v1/experiments/demo/revisions", {"config_yaml": text},
        content_type="application/json",
    )  # fmt: skip
    assert api.status_code == 400
    assert {"path": "runner.iterations", "line": line} == {
        k: v for k, v in api.json()["errors"][0].items() if k in ("path", "line")
    }


def test_launch_from_the_page_with_a_cluster_and_overrides(operator):
    create_experiment("demo", CONFIG)
    import_cluster_yaml(
        "one", (settings.BASE_DIR / "examples/clusters/one_machine.yaml").read_text()
    )
    preview = operator.get("/experiments/demo/launch/preview/?cluster=one").content.decode()
    assert 'data-component="actor"' in preview
    response = operator.post(
        "/experiments/demo/launch/",
        {"cluster": "one", "overrides": "runner.iterations=4\n", "timeout_s": "600",
         "tags": "sweep-a, gpu"},
    )  # fmt: skip
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/"
    assert (run.cluster.name, run.overrides, run.timeout_s, run.progress_total) == (
        "one", ["runner.iterations=4"], 600, 4,
    )  # fmt: skip
    assert "num_nodes: 1" in run.config_yaml
    assert run.tags == ["sweep-a", "gpu"]


def test_bad_overrides_are_refused_with_a_message_and_kept(operator):
    create_experiment("demo", CONFIG)
    response = operator.post("/experiments/demo/launch/", {"overrides": "nonsense"})
    assert response.status_code == 422
    page = response.content.decode()
    assert "Not key=value: nonsense" in page and "\nnonsense</textarea>" in page
    response = operator.post(
        "/experiments/demo/launch/", {"overrides": "runner.iterations=-1", "timeout_s": "77"}
    )
    page = response.content.decode()
    assert response.status_code == 422 and "runner.iterations" in page
    assert "\nrunner.iterations=-1</textarea>" in page and 'value="77"' in page
    assert not Run.objects.exists()


def test_the_home_dialog_launches_a_chosen_experiment(operator):
    create_experiment("demo", CONFIG)
    assert 'id="launch-dialog"' in operator.get("/").content.decode()
    missing = operator.post("/runs/launch/", {"experiment": "nope"}, follow=True)
    assert "Choose an experiment to launch." in missing.content.decode()
    response = operator.post(
        "/runs/launch/", {"experiment": "demo", "overrides": "runner.iterations=2"}
    )
    run = Run.objects.get()
    assert response["Location"] == f"/runs/{run.pk}/" and run.overrides == ["runner.iterations=2"]


def test_runs_list_filters_and_run_page(operator):
    experiment = create_experiment("demo", CONFIG)
    run, _ = launch_run(experiment, user=operator.user)
    other, _ = launch_run(experiment, user=operator.user, overrides=["runner.seed=2"])
    listed = operator.get("/runs/?state=queued&experiment=demo").content.decode()
    assert f'id="run-row-{run.pk}"' in listed and 'ws-connect="/ws/runs/"' in listed
    assert f'id="run-row-{run.pk}"' not in operator.get("/runs/?state=running").content.decode()
    page = operator.get(f"/runs/{run.pk}/").content.decode()
    assert "Stop" in page and f'ws-connect="/ws/runs/{run.pk}/?seen=' in page
    diff = operator.get(f"/runs/{other.pk}/diff/{run.pk}/").content.decode()
    assert "+  seed: 2" in diff


def test_runs_list_page_filters_sorts_pages_and_offers_compare(operator):
    experiment = create_experiment("demo", CONFIG, tags=["base"])
    runs = [launch_run(experiment, user=operator.user, tags=["odd"] if i % 2 else [])[0]
            for i in range(30)]  # fmt: skip
    for i, run in enumerate(runs):
        metric_points.store_points(run.pk, 1, 1.7e9, {"rollout/success_rate": i / 100})
    best = operator.get("/runs/?ordering=-success").content.decode()
    assert best.index(f'id="run-row-{runs[29].pk}"') < best.index(f'id="run-row-{runs[28].pk}"')
    assert f'id="run-row-{runs[0].pk}"' not in best  # on page 2 (25 a page)
    assert "0.29" in best and 'aria-current="page">1<' in best and "page=2" in best
    second = operator.get("/runs/?ordering=-success&page=2").content.decode()
    assert f'id="run-row-{runs[0].pk}"' in second and "ordering=-success&page=1" in second
    tagged = operator.get("/runs/?tag=odd&creator=olga").content.decode()
    assert tagged.count('class="compare-pick"') == 15
    assert f'id="run-row-{runs[0].pk}"' not in tagged
    assert 'id="compare-runs" data-href="/runs/compare/"' in best
    assert 'class="list pickable"' in best
    wrong = operator.get("/runs/?ordering=size").content.decode()
    assert "Unknown ordering" in wrong


def test_viewers_see_but_cannot_change(client):
    create_experiment("demo", CONFIG)
    client.force_login(get_user_model().objects.create_user("vic"))
    page = client.get("/experiments/demo/").content.decode()
    assert "Launching needs the operator role." in page
    assert client.post("/experiments/demo/launch/", {}).status_code == 403
    assert client.post("/experiments/", {"name": "x", "config_yaml": CONFIG}).status_code == 403


def test_the_run_page_lists_the_runs_files_and_serves_them(client):
    from controlplane.runs.artifacts import run_artifact_dir

    viewer = get_user_model().objects.create_user("vera")
    client.force_login(viewer)
    run, _ = launch_run(create_experiment("files", CONFIG), user=viewer)
    folder = run_artifact_dir(run.pk)
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "iter_000020.pt").write_bytes(b"\0" * 2048)
    (folder / "metrics.jsonl").write_text('{"iteration": 1}\n')
    page = client.get(f"/runs/{run.pk}/").content.decode()
    files = page[page.index('id="run-files"') :]
    assert files.index("checkpoints/iter_000020.pt") < files.index("metrics.jsonl")
    assert 'data-bytes="2048">2.0\xa0KB' in files
    download = client.get(f"/runs/{run.pk}/files/metrics.jsonl")
    assert b"".join(download) == b'{"iteration": 1}\n'
    assert 'filename="metrics.jsonl"' in download["Content-Disposition"]
    assert client.get(f"/runs/{run.pk}/files/../run-{run.pk + 1}/x").status_code == 404
    assert client.get(f"/runs/{run.pk}/files/checkpoints").status_code == 404  # a folder


def test_the_run_page_shows_where_each_process_is_next_to_the_plan(client):
    from controlplane.runs.models import RunEvent

    client.force_login(get_user_model().objects.create_user("vera"))
    placed = CONFIG + "cluster: {num_nodes: 2, component_placement: {actor: '0-1'}}\n"
    run, _ = launch_run(create_experiment("spread", placed), user=None)
    page = client.get(f"/runs/{run.pk}/").content.decode()
    table = page[page.index('id="run-processes"') :]
    assert table.count("<tr data-component=") == 2 and "starting" in table
    processes = [
        {"component": "actor", "rank": rank, "node_rank": rank, "node_ip": f"10.0.0.{rank + 1}",
         "pid": 4000 + rank, "visible_devices": None, "interpreter": "/usr/bin/python3",
         "device": f"cuda:0 NVIDIA H100 80GB HBM3 <{rank}>"}
        for rank in (0, 1)
    ]  # fmt: skip
    RunEvent.objects.create(run=run, kind="placed", data={"processes": processes})
    page = client.get(f"/runs/{run.pk}/").content.decode()
    row = page[page.index('data-component="actor" data-rank="1"') :].split("</tr>")[0]
    assert "node 1" in row and "10.0.0.2" in row and "4001" in row and "all" in row
    # what the process computes on, as text
    assert "<td>cuda:0 NVIDIA H100 80GB HBM3 &lt;1&gt;</td>" in row


def test_only_an_operator_resumes_an_interrupted_run_and_only_once(operator, client):
    from controlplane.runs.models import RunState
    from controlplane.runs.state import transition

    run, _ = launch_run(create_experiment("resumable", CONFIG), user=operator.user)
    transition(run.pk, RunState.SUBMITTING)
    transition(run.pk, RunState.INTERRUPTED, "the control plane was stopped")
    page = operator.get(f"/runs/{run.pk}/").content.decode()
    assert f'action="/runs/{run.pk}/resume/"' in page
    assert operator.post(f"/runs/{run.pk}/resume/").status_code == 302
    resumed = Run.objects.get(pk=run.pk)
    assert resumed.state == RunState.QUEUED and resumed.attempt == 2
    assert resumed.submission_id == f"armature-run-{run.pk}-a2"
    again = operator.post(f"/runs/{run.pk}/resume/", follow=True).content.decode()
    assert "only interrupted or cancelled runs resume" in again


def test_a_cancelled_run_resumes_once_it_has_a_checkpoint_and_its_job_ended(
    operator, settings, tmp_path
):
    from controlplane.runs import artifacts
    from controlplane.runs.models import RunState
    from controlplane.runs.state import transition

    settings.ARTIFACTS_DIR = tmp_path / "artifacts"

    run, _ = launch_run(create_experiment("stopped", CONFIG), user=operator.user)
    transition(run.pk, RunState.SUBMITTING)
    transition(run.pk, RunState.CANCELLED, "cancelled by olga", job_ended=False)
    page = operator.get(f"/runs/{run.pk}/").content.decode()
    assert f'action="/runs/{run.pk}/resume/"' not in page  # nothing to continue from
    refused = operator.post(f"/runs/{run.pk}/resume/", follow=True).content.decode()
    assert "cancelled before its first checkpoint: launch it again instead" in refused

    saved = artifacts.checkpoint_path(run.pk, 7)
    saved.parent.mkdir(parents=True)
    saved.write_bytes(b"weights")
    assert f'action="/runs/{run.pk}/resume/"' in operator.get(f"/runs/{run.pk}/").content.decode()
    early = operator.post(f"/runs/{run.pk}/resume/", follow=True).content.decode()
    assert "has not ended yet; try again in a few seconds" in early
    Run.objects.filter(pk=run.pk).update(job_ended=True)
    assert operator.post(f"/runs/{run.pk}/resume/").status_code == 302
    resumed = Run.objects.get(pk=run.pk)
    assert (resumed.state, resumed.attempt, resumed.cancel_requested_at) == (
        RunState.QUEUED, 2, None,
    )  # fmt: skip
    assert resumed.events.filter(kind="resumed").exists()
