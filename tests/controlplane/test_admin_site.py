"""Django's admin site asks the access table too: a staff user holding every model
permission, but not the admin role, is refused on every page of it, so cannot write a
node's env vars or interpreter (a shell on every node) nor make themselves an admin."""

import re

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.test import Client

from controlplane.inventory.models import Cluster, EnvConfig
from controlplane.inventory.services import import_cluster_yaml

pytestmark = pytest.mark.django_db

TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()
SHELL = 'OMP_NUM_THREADS: "4"\n            - PYTHONWARNINGS: "x"'


def staff_with_every_permission(name: str, role: str) -> tuple[Client, object]:
    user = get_user_model().objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(Permission.objects.all())
    user.groups.add(Group.objects.get_or_create(name=role)[0])
    client = Client()
    client.force_login(user)
    return client, user


def form_fields(client: Client, url: str) -> dict:
    """What a browser would post back from the admin's form at `url`, as a superuser
    sees it: its inputs, ticked boxes and selected options."""
    page = client.get(url).content.decode()
    fields = dict(re.findall(r'<input type="(?:hidden|text)" name="([^"]+)" value="([^"]*)"', page))
    fields.pop("csrfmiddlewaretoken", None)
    return fields


@pytest.fixture
def superuser_client() -> Client:
    client = Client()
    client.force_login(get_user_model().objects.create_superuser("root", password="pw"))
    return client


@pytest.mark.parametrize("role", ["viewer", "operator"])
def test_staff_without_the_admin_role_is_refused_everywhere_on_the_admin_site(role):
    client, _ = staff_with_every_permission("sam", role)
    for path in ("/admin/", "/admin/inventory/cluster/", "/admin/auth/user/",
                 "/admin/inventory/envconfig/", "/admin/auth/group/add/"):  # fmt: skip
        response = client.get(path)
        assert response.status_code == 302, f"{path}: {response.status_code}"
        assert response["Location"].startswith("/admin/login/?next=")


def test_staff_without_the_admin_role_cannot_write_a_nodes_env_vars(superuser_client):
    cluster = import_cluster_yaml("lab", TWO_NODES)
    url = f"/admin/inventory/cluster/{cluster.pk}/change/"
    fields = form_fields(superuser_client, url)
    client, _ = staff_with_every_permission("sam", "operator")
    response = client.post(
        url,
        {
            **fields,
            "description": "d",
            "yaml_text": TWO_NODES.replace('OMP_NUM_THREADS: "4"', SHELL),
        },
    )
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    env_vars = [row.env_vars for row in EnvConfig.objects.filter(node_group__cluster=cluster)]
    assert "PYTHONWARNINGS" not in str(env_vars)
    assert Cluster.objects.get(pk=cluster.pk).description == ""


def test_staff_without_the_admin_role_cannot_make_themselves_an_admin(superuser_client):
    client, user = staff_with_every_permission("sam", "operator")
    url = f"/admin/auth/user/{user.pk}/change/"
    fields = form_fields(superuser_client, url)
    admins = Group.objects.get_or_create(name="admin")[0]
    response = client.post(
        url,
        {**fields, "is_active": "on", "is_staff": "on", "is_superuser": "on",
         "groups": [admins.pk]},
    )  # fmt: skip
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")
    user.refresh_from_db()
    assert not user.is_superuser
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]


def test_the_same_form_posted_by_an_admin_changes_the_cluster(superuser_client):
    """The refusals above are the door's, not a form that could not have been saved."""
    cluster = import_cluster_yaml("lab", TWO_NODES)
    url = f"/admin/inventory/cluster/{cluster.pk}/change/"
    fields = form_fields(superuser_client, url)
    response = superuser_client.post(
        url,
        {
            **fields,
            "description": "d",
            "yaml_text": TWO_NODES.replace('OMP_NUM_THREADS: "4"', SHELL),
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    env_vars = [row.env_vars for row in EnvConfig.objects.filter(node_group__cluster=cluster)]
    assert "PYTHONWARNINGS" in str(env_vars)
