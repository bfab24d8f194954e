"""Process-level settings (env vars, interpreter) in an experiment's own cluster section
are for admins only: an operator can neither save nor launch them, through the API or
the pages, and each refusal names the key path. The inventory is where they belong."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.test import Client
from rest_framework.test import APIClient

from controlplane.experiments.models import Experiment
from controlplane.experiments.services import create_experiment
from controlplane.inventory.services import import_cluster_yaml
from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()
# What the review showed: these two variables make any Python process run a shell
# command as it starts.
HOSTILE_ENV = (
    "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: cpu\n      node_ranks: 0\n"
    "      env_configs:\n        - node_ranks: 0\n          env_vars:\n"
    "            - PYTHONWARNINGS: 'all:0:antigravity.x:0:0'\n"
    "            - BROWSER: \"/bin/sh -c 'touch /tmp/owned' %s\"\n"
)
HOSTILE_INTERPRETER = (
    "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: cpu\n      node_ranks: 0\n"
    "      env_configs:\n        - node_ranks: 0\n          python_interpreter_path: /tmp/x.sh\n"
)
ENV_PATH = "cluster.node_groups[0].env_configs[0].env_vars"
INTERPRETER_PATH = "cluster.node_groups[0].env_configs[0].python_interpreter_path"


def user_with_role(name: str, role: str):
    user = get_user_model().objects.create_user(name, is_superuser=role == "admin")
    if role == "operator":
        user.groups.add(Group.objects.get_or_create(name="operator")[0])
    return user


def api_as(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def operator():
    return api_as(user_with_role("olga", "operator"))


@pytest.fixture
def admin():
    return api_as(user_with_role("ada", "admin"))


def problems(response) -> dict[str, str]:
    return {p["path"]: p["message"] for p in response.json()["errors"]}


@pytest.mark.parametrize(
    ("section", "path"), [(HOSTILE_ENV, ENV_PATH), (HOSTILE_INTERPRETER, INTERPRETER_PATH)]
)
def test_an_operator_cannot_save_process_settings(operator, section, path):
    created = operator.post(
        "/api/v1/experiments", {"name": "x", "config_yaml": CONFIG + section}, format="json"
    )
    assert created.status_code == 400
    assert "admin" in problems(created)[path]
    assert not Experiment.objects.filter(name="x").exists()
    create_experiment("clean", CONFIG)
    revised = operator.post(
        "/api/v1/experiments/clean/revisions", {"config_yaml": CONFIG + section}, format="json"
    )
    assert revised.status_code == 400 and path in problems(revised)
    assert Experiment.objects.get(name="clean").revisions.count() == 1


def test_an_operator_cannot_launch_them_from_an_admins_experiment(operator, admin):
    saved = admin.post(
        "/api/v1/experiments", {"name": "env", "config_yaml": CONFIG + HOSTILE_ENV}, format="json"
    )
    assert saved.status_code == 201
    launched = operator.post("/api/v1/runs", {"experiment": "env"}, format="json")
    assert launched.status_code == 400 and ENV_PATH in problems(launched)
    assert not Run.objects.exists()
    # With a cluster of the inventory, the inventory's section replaces the experiment's.
    import_cluster_yaml("lab", TWO_NODES)
    placed = operator.post("/api/v1/runs", {"experiment": "env", "cluster": "lab"}, format="json")
    assert placed.status_code == 201
    assert "PYTHONWARNINGS" not in Run.objects.get().config_yaml
    by_admin = admin.post("/api/v1/runs", {"experiment": "env"}, format="json")
    assert by_admin.status_code == 201
    assert "PYTHONWARNINGS" in Run.objects.get(pk=by_admin.json()["id"]).config_yaml


def test_an_operator_cannot_add_them_with_an_override(operator):
    create_experiment("clean", CONFIG)
    override = (
        'cluster={"num_nodes": 1, "node_groups": [{"label": "cpu", "node_ranks": 0, '
        '"env_configs": [{"node_ranks": 0, "python_interpreter_path": "/tmp/x.sh"}]}]}'
    )
    launched = operator.post(
        "/api/v1/runs", {"experiment": "clean", "overrides": [override]}, format="json"
    )
    assert launched.status_code == 400 and INTERPRETER_PATH in problems(launched)
    assert not Run.objects.exists()


def test_the_pages_refuse_them_with_the_key_path():
    page = Client()
    page.force_login(user_with_role("olga", "operator"))
    created = page.post("/experiments/", {"name": "x", "config_yaml": CONFIG + HOSTILE_ENV})
    assert created.status_code == 422 and ENV_PATH in created.content.decode()
    checked = page.post("/experiments/validate/", {"config_yaml": CONFIG + HOSTILE_ENV})
    assert ENV_PATH in checked.content.decode()
    create_experiment("env", CONFIG + HOSTILE_ENV, author=user_with_role("ada", "admin"))
    launched = page.post("/experiments/env/launch/", {"overrides": "", "tags": ""})
    assert launched.status_code == 422 and ENV_PATH in launched.content.decode()
    cloned = page.post("/experiments/env/clone/", {"name": "mine"}, follow=True)
    assert "The clone is refused" in cloned.content.decode()
    assert not Experiment.objects.filter(name="mine").exists()
    assert not Run.objects.exists()
