"""A password in a camera's URL is the run's to use and nobody's to read: the run page's
config and overrides, the diff between two runs, the compare table and the config.yaml
in the run's folder all show `***` in its place, while the frozen config the job gets
keeps it."""

import pytest
import yaml
from django.contrib.auth import get_user_model

from controlplane.runs.run_page import config_differences
from tests.runs import CONFIG, queued_run
from trainer.config.loading import load_config
from trainer.runner.on_policy_runner import OnPolicyRunner

pytestmark = pytest.mark.django_db

SECRET = "s3cr3t-pw"
CAMERA = f"http://viewer:{SECRET}@192.0.2.20:8080/stream?topic=/wrist"


def with_camera(url: str) -> str:
    document = yaml.safe_load(CONFIG)
    document["env"]["real_robot"] = {"robots": [{
        "url": "http://192.0.2.10:5000/", "cameras": [{"name": "wrist", "url": url}],
        "safety_box": {"xyz_low": [0, 0, 0], "xyz_high": [1, 1, 1]},
    }]}  # fmt: skip
    return yaml.safe_dump(document)


def test_the_run_page_diff_and_compare_never_show_a_cameras_password(client):
    run = queued_run("cams", with_camera(CAMERA))
    run.overrides = [f"env.real_robot.robots[0].cameras[0].url={CAMERA}"]
    run.save()
    other = queued_run(run.experiment, with_camera("http://192.0.2.21/stream"))
    client.force_login(get_user_model().objects.create_user("vera"))
    page = client.get(f"/runs/{run.pk}/").content.decode()
    assert SECRET not in page and "http://viewer:***@192.0.2.20:8080/stream" in page
    diff = client.get(f"/runs/{run.pk}/diff/{other.pk}/").content.decode()
    assert SECRET not in diff and "viewer:***@" in diff
    shown = str(config_differences([run, other]))
    assert SECRET not in shown and "viewer:***@" in shown
    assert SECRET in run.config_yaml  # what the job is given


def test_the_run_folders_config_has_no_password(tmp_path):
    config = load_config(None, [
        "runner.iterations=1", "runner.progress=false", "env.num_parallel_envs=2",
        "algorithm.data_batch_size=2", f"runner.output_dir={tmp_path}", "runner.torch_threads=1",
    ])  # fmt: skip
    data = config.model_dump(mode="json")
    data["env"]["real_robot"]["robots"] = [{
        "url": "http://192.0.2.10:5000/", "cameras": [{"name": "wrist", "url": CAMERA}],
        "safety_box": {"xyz_low": [0, 0, 0], "xyz_high": [1, 1, 1]},
    }]  # fmt: skip
    runner = OnPolicyRunner(type(config).model_validate(data))
    try:
        runner.learn()
    finally:
        runner.close()
    written = (tmp_path / "config.yaml").read_text()
    assert SECRET not in written and "viewer:***@192.0.2.20" in written
