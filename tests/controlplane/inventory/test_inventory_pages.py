"""Inventory pages: import, detail, YAML editing with validation, export, robots and the
placement preview fragment. Everyone logged in reads the inventory; admins write it."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.files.uploadedfile import SimpleUploadedFile

from controlplane.inventory.models import Cluster, NodeGroup
from controlplane.inventory.services import import_cluster_yaml

pytestmark = pytest.mark.django_db

TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()


@pytest.fixture
def user_client(client):
    """An admin: the inventory is shared by every run, so only admins change it."""
    admin = get_user_model().objects.create_user("ada")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    client.force_login(admin)
    return client


@pytest.fixture
def operator_client(client):
    operator = get_user_model().objects.create_user("otto")
    operator.groups.add(Group.objects.get_or_create(name="operator")[0])
    client.force_login(operator)
    return client


def test_it_imports_pasted_yaml(user_client):
    response = user_client.post("/cluster/", {"name": "lab", "yaml_text": TWO_NODES})
    assert response.status_code == 302
    assert response["Location"] == "/cluster/lab/"
    page = user_client.get("/cluster/lab/").content.decode()
    assert "192.0.2.10" in page and "2 × RTX4090" in page and "OMP_NUM_THREADS=4" in page


def test_it_imports_an_uploaded_file(user_client):
    upload = SimpleUploadedFile("lab.yaml", TWO_NODES.encode(), content_type="text/yaml")
    response = user_client.post("/cluster/", {"name": "lab2", "yaml_file": upload})
    assert response.status_code == 302
    assert Cluster.objects.get(name="lab2").num_nodes == 2


def test_it_shows_import_errors_with_their_lines(user_client):
    bad = "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: node\n      node_ranks: 0\n"
    page = user_client.post("/cluster/", {"name": "bad", "yaml_text": bad}).content.decode()
    assert "line 4" in page and "reserved" in page
    assert not Cluster.objects.filter(name="bad").exists()


def test_it_asks_for_some_yaml(user_client):
    page = user_client.post("/cluster/", {"name": "empty"}).content.decode()
    assert "Paste the cluster YAML or choose a file." in page


def test_it_exports_and_edits_the_yaml(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    exported = user_client.get("/cluster/lab/export.yaml")
    assert exported["Content-Disposition"] == 'attachment; filename="lab.yaml"'
    text = exported.content.decode().replace("num_nodes: 2", "num_nodes: 3")
    assert user_client.post("/cluster/lab/edit/", {"yaml_text": text}).status_code == 302
    assert Cluster.objects.get(name="lab").num_nodes == 3


def test_the_editor_opens_rows_edited_into_an_invalid_cluster_with_their_problems(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    NodeGroup.objects.filter(label="gpu").update(node_ranks="0-9")
    page = user_client.get("/cluster/lab/edit/")
    assert page.status_code == 200
    html = page.content.decode()
    assert "cluster.node_groups[0].node_ranks" in html and "node_ranks.out_of_range" in html
    assert "0-9" in html  # the rows as they are, to be fixed
    assert user_client.post("/cluster/lab/edit/", {"yaml_text": TWO_NODES}).status_code == 302


def test_the_editor_validates_as_you_type(user_client):
    ok = user_client.post("/cluster/validate/", {"yaml_text": TWO_NODES}).content.decode()
    assert "Valid." in ok
    bad = user_client.post("/cluster/validate/", {"yaml_text": "cluster: [1"}).content.decode()
    assert 'id="config-issues"' in bad and "line" in bad


def test_the_preview_fragment_draws_the_grid(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    html = user_client.post(
        "/cluster/lab/placement/preview/",
        {"placement": "actor: 0-1\nagent: {node_group: node, placement: '0-1'}"},
    ).content.decode()
    assert 'data-resource="RTX4090 1"' in html
    assert 'data-component="actor">actor 1<' in html
    assert 'data-component="agent">agent 0<' in html
    assert "Franka robot/0" in html


def test_the_preview_fragment_lists_errors_by_line(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    html = user_client.post(
        "/cluster/lab/placement/preview/",
        {"placement": "actor: 0-1\nenv: {node_group: nope, placement: '0'}"},
    ).content.decode()
    assert 'data-error-lines="2 "' in html
    assert "nope" in html


def test_the_placement_page_starts_from_the_clusters_own_placement(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    html = user_client.get("/cluster/lab/placement/").content.decode()
    assert '"0:0-3"' in html  # placement strings quoted
    assert 'data-component="env">env 0-3<' in html


def test_the_robots_page_lists_robots(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    html = user_client.get("/robots/").content.decode()
    assert "robot-0" in html and "Franka" in html and "322142001240" in html


def test_unknown_clusters_are_404(user_client):
    assert user_client.get("/cluster/nope/").status_code == 404


def test_only_admins_import_or_edit_clusters(operator_client):
    import_cluster_yaml("lab", TWO_NODES)
    imported = operator_client.post("/cluster/", {"name": "lab2", "yaml_text": TWO_NODES})
    assert imported.status_code == 403
    assert "This needs the admin role; you are operator." in imported.content.decode()
    assert operator_client.get("/cluster/lab/edit/").status_code == 403
    edited = operator_client.post("/cluster/lab/edit/", {"yaml_text": "cluster: {num_nodes: 3}"})
    assert edited.status_code == 403
    assert list(Cluster.objects.values_list("name", "num_nodes")) == [("lab", 2)]


def test_non_admins_are_not_offered_the_import_form_or_the_editor(operator_client):
    import_cluster_yaml("lab", TWO_NODES)
    listing = operator_client.get("/cluster/").content.decode()
    assert 'id="import"' not in listing and "Admins import and edit clusters." in listing
    assert "/cluster/lab/edit/" not in operator_client.get("/cluster/lab/").content.decode()


def test_admins_are_offered_both(user_client):
    import_cluster_yaml("lab", TWO_NODES)
    assert 'id="import"' in user_client.get("/cluster/").content.decode()
    assert "/cluster/lab/edit/" in user_client.get("/cluster/lab/").content.decode()


def test_the_cluster_page_shows_interpreters_by_group_and_ignored_hardware(operator_client):
    text = (settings.BASE_DIR / "examples/clusters/simulators_and_robots.yaml").read_text()
    import_cluster_yaml("sims", text)
    page = operator_client.get("/cluster/sims/").content.decode()
    assert "ignored: placed per node" in page
    assert "sim: <code>/opt/venv/sim/bin/python3</code>" in page
    assert "robot: <code>/opt/venv/franka/bin/python3</code>" in page
