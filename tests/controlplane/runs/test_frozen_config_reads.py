"""A run's frozen config is read back in the dialect it was written in (YAML 1.2): a
placement such as `2:0` stays the text the user wrote on the run and compare pages, and
a config that cannot be read is shown as an error, never as an empty table."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from controlplane.experiments.services import create_experiment
from controlplane.runs.launch import launch_run
from controlplane.runs.models import Run

pytestmark = pytest.mark.django_db

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()


def placed_on(node: int) -> str:
    # Unquoted, as a user writes it: YAML 1.1 would read `2:0` as 120 (base 60).
    return CONFIG + (
        "cluster:\n  num_nodes: 3\n  component_placement:\n"
        f"    actor:\n      node_group: node\n      placement: {node}:0\n"
    )


@pytest.fixture
def viewer(client):
    client.force_login(get_user_model().objects.create_user("vic"))
    return client


def launched(name: str, config: str) -> Run:
    return launch_run(create_experiment(name, config), user=None)[0]


def test_the_run_page_plans_a_base_60_looking_placement(viewer):
    run = launched("on-node-2", placed_on(2))
    assert "placement: 2:0" in run.config_yaml  # written unquoted by the YAML 1.2 dumper
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    row = page[page.index('data-component="actor" data-rank="0"') :].split("</tr>")[0]
    assert "node 2" in row


def test_the_compare_page_shows_the_placement_as_written(viewer):
    first, second = launched("a", placed_on(2)), launched("b", placed_on(1))
    page = viewer.get(f"/runs/compare/?ids={first.pk},{second.pk}").content.decode()
    row = page[page.index('data-key="cluster.component_placement.actor.placement"') :]
    row = row.split("</tr>")[0]
    assert "<code>2:0</code>" in row and "<code>1:0</code>" in row
    assert "120" not in row


def test_an_unreadable_stored_config_is_shown_as_an_error(viewer):
    run = launched("broken", CONFIG)
    Run.objects.filter(pk=run.pk).update(config_yaml="cluster: [unclosed\n")
    page = viewer.get(f"/runs/{run.pk}/").content.decode()
    assert 'id="run-config-problem"' in page and "not valid YAML" in page
    table = page[page.index('id="run-processes"') :].split("</table>")[0]
    assert "cannot be read" in table and "No placement yet" not in table
    other = launched("fine", CONFIG)
    compare = viewer.get(f"/runs/compare/?ids={run.pk},{other.pk}").content.decode()
    assert "stored config cannot be read" in compare
