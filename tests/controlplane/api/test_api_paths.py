"""Every API path answers with and without its trailing slash, as people and scripts
write both (`GET /api/v1/runs/` was a 404)."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from rest_framework.test import APIClient

pytestmark = pytest.mark.django_db

CLUSTER = "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: box\n      node_ranks: 0\n"


@pytest.fixture
def admin() -> APIClient:
    user = get_user_model().objects.create_user("ada")
    user.groups.add(Group.objects.get_or_create(name="admin")[0])
    client = APIClient()
    client.force_authenticate(user)
    return client


@pytest.mark.parametrize("path", ["/api/v1/runs", "/api/v1/clusters", "/api/v1/experiments"])
def test_a_list_answers_with_and_without_the_slash(admin, path):
    assert admin.get(path).status_code == 200
    assert admin.get(path + "/").status_code == 200


def test_a_cluster_is_created_and_read_under_either_spelling(admin):
    made = admin.post("/api/v1/clusters/", {"name": "lab", "yaml": CLUSTER}, format="json")
    assert made.status_code == 201, made.content
    assert admin.get("/api/v1/clusters/lab/").json()["name"] == "lab"
    assert admin.get("/api/v1/clusters/lab").json()["name"] == "lab"
