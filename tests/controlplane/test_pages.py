"""The web shell: every page of the navigation answers a logged-in user and sends
anonymous visitors to the login page; every page carries the Content-Security-Policy and
its markup holds nothing the policy would refuse (inline script, handler or style)."""

from html.parser import HTMLParser

import pytest
from django.contrib.auth import get_user_model

from controlplane.core.bootstrap import seed_demo
from tests.runs import submitted_run

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


@pytest.mark.parametrize("path", ["/no/such/page/", "/api/v1/docs/"])
def test_the_not_found_and_api_docs_pages_carry_the_navigation(user_client, path):
    response = user_client.get(path)
    html = response.content.decode()
    assert response.status_code == (404 if "such" in path else 200)
    assert '<nav aria-label="Main">' in html and '<a href="/runs/" >Runs</a>' in html
    assert "Log out" in html and "/static/armature/topbar.css" in html


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


def test_the_vla_demo_keeps_its_model_and_demos_in_this_machines_var_folder(settings):
    from controlplane.experiments.models import Experiment
    from trainer.config.loading import parse_yaml, validate_config

    seed_demo()
    revision = Experiment.objects.get(name="demo-vla").latest_revision
    config = validate_config(parse_yaml(revision.config_yaml, "demo-vla"))
    assert config.actor.model.kind == "vla" and config.algorithm.name == "bc"
    assert config.actor.model.path == f"{settings.VAR_DIR / 'models'}/tiny-vla-builtin"
    assert config.algorithm.bc.demos.startswith(f"{settings.VAR_DIR / 'demos'}/")
    revision = Experiment.objects.get(name="demo-pi0").latest_revision
    config = validate_config(parse_yaml(revision.config_yaml, "demo-pi0"))
    assert config.actor.model.tiny_family == "pi0" and config.algorithm.name == "bc"
    assert config.actor.model.path == f"{settings.VAR_DIR / 'models'}/tiny-pi0-builtin-64"


def test_login_page_reports_bad_credentials(client):
    response = client.post("/login/", {"username": "nobody", "password": "wrong"})
    assert response.status_code == 200
    assert "didn't match" in response.content.decode()


class InlineCode(HTMLParser):
    """What a page's markup would run or style inline: a <script> with code in it, an
    event-handler or style attribute, a <style> element, a javascript: address."""

    def __init__(self) -> None:
        super().__init__()
        self.found: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        names = dict(attrs)
        if tag == "script" and names.get("type") != "application/json":
            self._in_script = True
            if "src" not in names:
                self.found.append("<script> without src")
        if tag == "style":
            self.found.append("<style>")
        for name, value in attrs:
            if name.startswith("on") or name == "style" or name.startswith("hx-on"):
                self.found.append(f"<{tag} {name}={value!r}>")
            if name in ("href", "src", "action") and (value or "").startswith("javascript:"):
                self.found.append(f"<{tag} {name}={value!r}>")

    def handle_endtag(self, tag: str) -> None:
        if tag == "script":
            self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script and data.strip():
            self.found.append(f"inline script: {data.strip()[:60]}")


@pytest.fixture
def admin_client(client):
    admin = get_user_model().objects.create_user(
        "root", password="pw-for-tests", is_staff=True, is_superuser=True
    )
    client.force_login(admin)
    return client


def test_every_page_sends_a_policy_that_runs_no_inline_script_or_style(admin_client):
    cluster, experiment = seed_demo()
    first, second = submitted_run(experiment), submitted_run(experiment)
    pages = PAGES + [
        f"/runs/{first.pk}/", f"/runs/compare/?ids={first.pk},{second.pk}",
        f"/runs/{first.pk}/diff/{second.pk}/", f"/experiments/{experiment.name}/",
        f"/cluster/{cluster.name}/", f"/cluster/{cluster.name}/edit/",
        f"/cluster/{cluster.name}/placement/", f"/console/runs/{first.pk}/",
        "/console/audit/", "/settings/", "/admin/",
    ]  # fmt: skip
    for path in pages:
        response = admin_client.get(path)
        assert response.status_code == 200, path
        policy = dict(
            directive.strip().split(" ", 1)
            for directive in response["Content-Security-Policy"].split(";")
        )
        assert policy["script-src"] == "'self'", path
        assert policy["style-src"] == "'self'", path
        assert "ws://testserver" in policy["connect-src"], path
        if path.startswith("/admin/"):
            continue  # Django's own markup, not ours
        markup = InlineCode()
        markup.feed(response.content.decode())
        assert markup.found == [], (path, markup.found)


def test_the_login_page_and_api_answers_carry_the_policy_too(client):
    for response in (client.get("/login/"), client.get("/api/v1/schema/")):
        assert "script-src 'self'" in response["Content-Security-Policy"]


def test_the_api_docs_start_up_script_is_a_file_of_its_own(user_client):
    html = user_client.get("/api/v1/docs/").content.decode()
    markup = InlineCode()
    markup.feed(html)
    assert markup.found == []
    script = user_client.get("/api/v1/docs/?script=")
    assert script.status_code == 200
    assert script["Content-Type"].startswith("application/javascript")
    assert "SwaggerUIBundle" in script.content.decode()


def test_no_script_of_ours_inserts_text_as_html():
    """Server text reaches pages as text (textContent, template escaping). The one
    `innerHTML` left parses the server's own template-escaped fragment inert, inside a
    <template>, to hand it back to htmx: nothing else may join it."""
    from pathlib import Path

    allowed = {("app.js", "incoming.innerHTML = text;"), ("app.js", "return incoming.innerHTML;")}
    found = set()
    for script in (Path(__file__).resolve().parents[2] / "frontend/static/armature").glob("*.js"):
        for line in script.read_text().splitlines():
            if any(sink in line for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML",
                                              "document.write")):  # fmt: skip
                found.add((script.name, line.strip()))
    assert found == allowed
