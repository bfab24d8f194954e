"""A run the control plane launches gets a folder made for it, fresh and its user's
alone, and reads files only inside the folders an admin allows: a folder planted ahead
of the run fails the run instead of being inherited, and a config naming a file outside
the roots (or a relative one) is refused at launch at its key path."""

import os
import stat

import pytest
import yaml
from django.conf import settings
from rest_framework.test import APIClient

from controlplane.experiments.services import create_experiment
from controlplane.runs import artifacts, submission
from controlplane.runs.models import Run, RunEvent, RunState
from trainer.config.path_roots import ROOTS_ENV

pytestmark = pytest.mark.django_db

CONFIG = yaml.safe_load((settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text())


@pytest.fixture
def roots(settings, tmp_path):
    settings.ARTIFACTS_DIR = tmp_path / "artifacts"
    settings.ARMATURE_MODELS_DIR = tmp_path / "models"
    settings.ARMATURE_DATASETS_DIR = tmp_path / "datasets"
    return tmp_path


def launch(operator: APIClient, name: str, **model) -> object:
    document = {**CONFIG, "actor": {**CONFIG.get("actor", {}), "model": model}}
    create_experiment(name, yaml.safe_dump(document))
    return operator.post("/api/v1/runs", {"experiment": name}, format="json")


def test_a_folder_planted_ahead_of_the_run_fails_it_instead_of_being_inherited(operator, roots):
    launched = operator.post("/api/v1/runs", {"experiment": create_experiment(
        "planted", yaml.safe_dump(CONFIG)).name}, format="json")  # fmt: skip
    run = Run.objects.get(pk=launched.json()["id"])
    planted = artifacts.run_artifact_dir(run.pk) / "checkpoints"
    planted.mkdir(parents=True)
    (planted / "iter_999999.pt").write_bytes(b"not the run's")
    submission.submit(run.pk)  # no Ray needed: it stops before asking
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    assert "was already there before run" in run.exit_reason
    assert (planted / "iter_999999.pt").read_bytes() == b"not the run's"  # left to look at


def test_a_run_folder_is_made_fresh_and_its_users_alone(roots):
    folder = artifacts.make_run_folder(41)
    assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700 and not any(folder.iterdir())
    with pytest.raises(artifacts.RunFolderTaken):
        artifacts.make_run_folder(41)


@pytest.mark.parametrize(
    ("model", "key"),
    [
        ({"init_from": "/etc/armature/other-run.yaml"}, "actor.model.init_from"),
        ({"init_from": "examples/builtin_vla_sft.yaml"}, "actor.model.init_from"),
        ({"init_from": "{models}/../elsewhere/run-1"}, "actor.model.init_from"),
    ],
)
def test_a_file_outside_the_allowed_folders_is_refused_at_launch(operator, roots, model, key):
    model = {k: v.format(models=roots / "models") for k, v in model.items()}
    launched = launch(operator, "outside", **model)
    assert launched.status_code == 400
    (problem,) = [p for p in launched.json()["errors"] if p["path"] == key]
    assert "relative" in problem["message"] or "outside the folders" in problem["message"]
    assert not Run.objects.exists()


def test_inside_the_allowed_folders_it_launches_and_the_job_is_told_them(operator, roots):
    start = roots / "artifacts" / "run-1"
    start.mkdir(parents=True)
    launched = launch(operator, "inside", init_from=str(start))
    assert launched.status_code == 201, launched.json()
    run = Run.objects.get(pk=launched.json()["id"])
    told = submission.job_environment(run)[ROOTS_ENV].split(os.pathsep)
    assert told == [str((roots / name).resolve()) for name in ("artifacts", "models",
                                                               "datasets")]  # fmt: skip


@pytest.mark.parametrize("first_job", ["submitted", "adopted"])
def test_an_attempt_submitted_again_continues_in_the_folder_its_first_job_began(
    operator, roots, first_job
):
    launched = operator.post("/api/v1/runs", {"experiment": create_experiment(
        "again", yaml.safe_dump(CONFIG)).name}, format="json")  # fmt: skip
    run = Run.objects.get(pk=launched.json()["id"])
    assert "--resume-if-any" not in submission.entrypoint(run)
    # Recorded as adopted when the submission's reply was lost and its retry found the
    # job: that job wrote in the folder all the same.
    RunEvent.objects.create(run=run, kind=first_job, data={"attempt": 1})
    assert "--resume-if-any" in submission.entrypoint(run)
