"""The web shell: every page of the navigation answers a logged-in user and sends
anonymous visitors to the login page."""

import pytest
from django.contrib.auth import get_user_model

from controlplane.core.bootstrap import seed_demo

pytestmark = pytest.mark.django_db

PAGES = ["/", "/runs/", "/experiments/", "/cluster/", "/robots/", "/console/", "/api/v1/docs/"]


@pytest.fixture
def user_client(client):
    client.force_login(get_user_model().objects.create_user("ada", password="pw-for-tests"))
    return client


@pytest.mark.parametrize("path", PAGES)
def test_it_serves_every_page_to_a_logged_in_user(user_client, path):
    assert user_client.get(path).status_code == 200


@pytest.mark.parametrize("path", PAGES)
def test_it_sends_anonymous_visitors_to_the_login_page(client, path):
    response = client.get(path)
    assert response.status_code == 302
    assert response["Location"] == f"/login/?next={path}"


def test_the_api_docs_are_served_without_a_cdn(user_client):
    html = user_client.get("/api/v1/docs/").content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/" in html
    assert "cdn" not in html.lower()
    assert user_client.get("/api/v1/schema/").status_code == 200


def test_the_api_schema_needs_credentials(client):
    response = client.get("/api/v1/schema/")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == "Bearer"


def test_htmx_and_its_websocket_extension_come_from_local_static_files(user_client):
    html = user_client.get("/").content.decode()
    assert "/static/django_htmx/htmx-2.min.js" in html
    assert "/static/django_htmx/ext/hx-ws-2.min.js" in html
    assert 'ws-connect="/ws/status/"' in html


def test_the_demo_shows_on_the_experiments_and_cluster_pages(user_client):
    seed_demo()
    assert "demo-builtin-ppo" in user_client.get("/experiments/").content.decode()
    assert "one-machine" in user_client.get("/cluster/").content.decode()


def test_the_demo_is_seeded_once():
    assert seed_demo() == seed_demo()


def test_login_page_reports_bad_credentials(client):
    response = client.post("/login/", {"username": "nobody", "password": "wrong"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()
