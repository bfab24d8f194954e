"""A run's console page offers a console only where the run has robots an operator can
take over (`env.interventions.source: console`); elsewhere it says why there is none.
Its buttons start disabled (the page enables them once the robots' state says they can
act), the drawn scene of the built-in env has a legend, and an admin's page knows it
may clear any e-stop."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group

from tests.runs import submitted_run

pytestmark = pytest.mark.django_db

CONSOLE = (settings.BASE_DIR / "examples/builtin_rlpd_console.yaml").read_text()


def logged_in(client, role: str):
    user = get_user_model().objects.create_user(role)
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    client.force_login(user)
    return client


def test_a_run_without_operator_copies_has_no_console(client):
    run = submitted_run("ppo")  # the built-in PPO example: no interventions
    page = logged_in(client, "operator").get(f"/console/runs/{run.pk}/").content.decode()
    assert 'id="no-console"' in page and "env.interventions.source: console" in page
    assert 'id="console"' not in page and "console.js" in page  # the script finds no root


@pytest.mark.parametrize(("role", "admin"), [("operator", "false"), ("admin", "true")])
def test_a_console_run_has_disabled_buttons_a_legend_and_knows_an_admin(client, role, admin):
    run = submitted_run("console", CONSOLE)
    page = logged_in(client, role).get(f"/console/runs/{run.pk}/").content.decode()
    assert 'id="no-console"' not in page and f'data-admin="{admin}"' in page
    assert page.count('disabled title="connecting"') == 7
    assert "ringed in white" in page
