"""The admin edits a cluster as YAML, validated like everywhere else."""

import re

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from controlplane.inventory.models import Cluster, NodeGroup

pytestmark = pytest.mark.django_db

TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()


def submit(client, url: str, fields: dict):
    """Post the admin form as a browser would: its hidden inputs plus `fields`."""
    page = client.get(url).content.decode()
    hidden = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', page))
    hidden.pop("csrfmiddlewaretoken", None)
    return client.post(url, {**hidden, **fields})


@pytest.fixture
def admin_client(client):
    client.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    return client


def test_it_adds_and_changes_a_cluster_through_its_yaml(admin_client):
    added = submit(
        admin_client,
        "/admin/inventory/cluster/add/",
        {"name": "lab", "description": "d", "yaml_text": TWO_NODES},
    )
    assert added.status_code == 302, added.content.decode()[:2000]
    cluster = Cluster.objects.get(name="lab")
    assert cluster.node_groups.count() == 2
    change_url = f"/admin/inventory/cluster/{cluster.pk}/change/"
    form = admin_client.get(change_url).content.decode()
    assert "RTX4090" in form and "192.0.2.10" in form
    changed = submit(
        admin_client,
        change_url,
        {"description": "e", "yaml_text": TWO_NODES.replace("count: 2", "count: 4")},
    )
    assert changed.status_code == 302
    assert Cluster.objects.get(name="lab").node_groups.get(label="gpu").accelerator_count == 4


def test_it_shows_validation_errors(admin_client):
    page = submit(
        admin_client,
        "/admin/inventory/cluster/add/",
        {"name": "bad", "yaml_text": "cluster:\n  num_nodes: 0\n"},
    ).content.decode()
    assert "num_nodes" in page
    assert not Cluster.objects.filter(name="bad").exists()


def test_a_cluster_whose_rows_were_edited_into_an_invalid_one_still_opens(admin_client):
    submit(admin_client, "/admin/inventory/cluster/add/", {"name": "lab", "yaml_text": TWO_NODES})
    cluster = Cluster.objects.get(name="lab")
    NodeGroup.objects.filter(cluster=cluster, label="gpu").update(node_ranks="0-9")
    page = admin_client.get(f"/admin/inventory/cluster/{cluster.pk}/change/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "The stored cluster is invalid" in html
    assert "cluster.node_groups[0].node_ranks" in html and "0-9" in html
