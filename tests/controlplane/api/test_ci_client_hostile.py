"""The CI client sending hostile configs to a real control plane (Django's live server):
the server's bounded reader refuses them at once, and the client says why and exits
with the "control plane refused" code."""

import os
import subprocess
import sys

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from controlplane.api.tokens import create_token
from controlplane.experiments.models import Experiment
from tests.hostile_yaml import ALIAS_BOMB, DEEP_NESTING

# Hang guard only: before the limits, the alias bomb kept the server busy for minutes.
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(120)]

EXIT_API_ERROR = 6


@pytest.fixture
def token() -> str:
    admin = get_user_model().objects.create_user("ci-admin")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    return create_token(admin, "CI")[1]


def submit(url: str, token: str, config) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "ARMATURE_"))}
    return subprocess.run(
        [sys.executable, "-m", "controlplane.client", "submit", str(config), "--url", url],
        cwd=settings.BASE_DIR, env={**env, "ARMATURE_TOKEN": token},
        capture_output=True, text=True, timeout=100,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "says"),
    [
        pytest.param(ALIAS_BOMB, "expands to more than 100000 nodes", id="alias-bomb"),
        pytest.param(DEEP_NESTING, "nests deeper than 64 levels", id="deep-nesting"),
    ],
)
def test_the_client_reports_the_refusal_of_a_hostile_config(
    live_server, token, tmp_path, text, says
):
    config = tmp_path / "hostile.yaml"
    config.write_text(text)
    done = submit(live_server.url, token, config)
    assert done.returncode == EXIT_API_ERROR, done.stdout + done.stderr
    assert "POST experiments → 400" in done.stdout
    assert says in done.stdout
    assert not Experiment.objects.exists()


def test_the_client_reports_a_body_past_the_size_limit(live_server, token, tmp_path):
    config = tmp_path / "big.yaml"
    config.write_text("name: big\n" + "#" * (settings.MAX_REQUEST_BYTES + 1) + "\n")
    done = submit(live_server.url, token, config)
    assert done.returncode == EXIT_API_ERROR, done.stdout + done.stderr
    assert "POST experiments → 413" in done.stdout
    assert "ARMATURE_MAX_REQUEST_BYTES" in done.stdout
