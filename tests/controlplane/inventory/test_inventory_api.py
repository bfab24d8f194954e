"""REST endpoints of the inventory and the placement preview."""

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

from controlplane.inventory.services import import_cluster_yaml

pytestmark = pytest.mark.django_db

TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.fixture
def api():
    admin = get_user_model().objects.create_user("ada")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    return client_for(admin)


@pytest.fixture
def viewer_api():
    return client_for(get_user_model().objects.create_user("vic"))


def test_it_refuses_anonymous_callers():
    assert APIClient().get("/api/v1/clusters").status_code in (401, 403)


def test_viewers_read_and_preview_but_do_not_write(viewer_api):
    import_cluster_yaml("lab", TWO_NODES)
    assert viewer_api.get("/api/v1/clusters/lab").status_code == 200
    preview = viewer_api.post("/api/v1/placement/preview", {"cluster": "lab"}, format="json")
    assert preview.status_code == 200
    refused = viewer_api.post("/api/v1/clusters", {"name": "x", "yaml": TWO_NODES}, format="json")
    assert refused.status_code == 403
    assert refused.json()["detail"] == "This needs the admin role; you are viewer."
    assert viewer_api.delete("/api/v1/clusters/lab").status_code == 403


def test_it_creates_lists_shows_exports_and_deletes_a_cluster(api):
    created = api.post("/api/v1/clusters", {"name": "lab", "yaml": TWO_NODES}, format="json")
    assert created.status_code == 201
    assert created.json()["num_nodes"] == 2
    assert [g["label"] for g in created.json()["node_groups"]] == ["gpu", "robot"]
    assert api.get("/api/v1/clusters").json()["results"][0]["name"] == "lab"
    shown = api.get("/api/v1/clusters/lab").json()
    assert shown["node_groups"][1]["robots"][0]["robot_ip"] == "192.0.2.10"
    exported = api.get("/api/v1/clusters/lab/export")
    assert exported["Content-Type"] == "text/yaml"
    assert "node_groups:" in exported.content.decode()
    nodes = api.get("/api/v1/clusters/lab/nodes").json()
    assert [n["rank"] for n in nodes["results"]] == [0, 1]
    assert api.delete("/api/v1/clusters/lab").status_code == 204
    assert api.get("/api/v1/clusters/lab").status_code == 404


def test_it_accepts_the_section_as_json_and_updates(api):
    config = {"num_nodes": 1, "node_groups": [{"label": "box", "node_ranks": "0"}]}
    assert (
        api.post("/api/v1/clusters", {"name": "j", "config": config}, format="json").status_code
        == 201
    )
    config["num_nodes"] = 3
    updated = api.put("/api/v1/clusters/j", {"name": "j", "config": config}, format="json")
    assert updated.status_code == 200
    assert updated.json()["num_nodes"] == 3


def test_it_answers_400_with_every_config_error(api):
    bad = "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: cluster\n      node_ranks: 0-2\n"
    response = api.post("/api/v1/clusters", {"name": "bad", "yaml": bad}, format="json")
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert len(errors) >= 2
    assert {"rule", "message", "location", "line", "component", "segment"} <= set(errors[0])


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"name": "x"},
        {"name": "x", "yaml": "a: 1", "config": {}},
        {"name": "no spaces", "yaml": "x"},
    ],
)
def test_it_names_malformed_payloads(api, body):
    response = api.post("/api/v1/clusters", body, format="json")
    assert response.status_code == 400
    assert response.json()


def test_placement_preview_returns_the_plan(api):
    import_cluster_yaml("lab", TWO_NODES)
    response = api.post(
        "/api/v1/placement/preview",
        {
            "cluster": "lab",
            "placement": "actor: 0-1:0-3\nenv: {node_group: robot, placement: '0:0-1'}",
        },
        format="json",
    )
    assert response.status_code == 200
    components = response.json()["plan"]["components"]
    assert components["actor"]["world_size"] == 4
    assert [p["visible_accelerators"] for p in components["actor"]["processes"]] == [
        [0],
        [0],
        [1],
        [1],
    ]
    assert components["env"]["processes"][0]["resource_kind"] == "hardware"


def test_placement_preview_takes_a_cluster_yaml_and_a_placement_object(api):
    response = api.post(
        "/api/v1/placement/preview",
        {
            "cluster_yaml": TWO_NODES,
            "placement": {"agent": {"node_group": "node", "placement": "0-1"}},
        },
        format="json",
    )
    assert response.status_code == 200
    assert list(response.json()["plan"]["components"]) == ["agent"]


def test_placement_preview_answers_400_with_the_errors(api):
    import_cluster_yaml("lab", TWO_NODES)
    response = api.post(
        "/api/v1/placement/preview",
        {"cluster": "lab", "placement": "actor: 0-1:0-200,2-3:201-511"},
        format="json",
    )
    assert response.status_code == 400
    errors = response.json()["errors"]
    assert errors[0]["component"] == "actor"
    assert errors[0]["line"] == 1
    assert "whole multiple" in errors[0]["message"]


def test_placement_preview_answers_404_for_an_unknown_cluster(api):
    response = api.post("/api/v1/placement/preview", {"cluster": "nope"}, format="json")
    assert response.status_code == 404


@pytest.mark.parametrize(
    "body", [{}, {"cluster": "a", "cluster_yaml": "b"}, {"cluster": "a", "placement": 5}]
)
def test_placement_preview_names_malformed_payloads(api, body):
    assert api.post("/api/v1/placement/preview", body, format="json").status_code == 400


def test_robots_are_listed(api):
    import_cluster_yaml("lab", TWO_NODES)
    robots = api.get("/api/v1/robots").json()["results"]
    assert [(r["cluster"], r["name"], r["type"]) for r in robots] == [("lab", "robot-0", "Franka")]
