"""Every door, every caller: each URL pattern (pages, API, the admin site) and each
WebSocket route is tried by anonymous visitors, viewers, operators, admins and holders
of a run token (this run's and another's), with every method, and must answer what
docs/permissions.md says. A URL or route without a rule fails here first."""

import re

import pytest
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group, Permission
from django.http import HttpResponse
from django.test import Client
from django.urls import include, path, reverse

from controlplane.access.doors import ADMIN_SITE, DOORS, SEE, Kind
from controlplane.access.pages import guarded
from controlplane.api.models import ApiToken
from controlplane.api.tokens import create_token
from controlplane.core import access_matrix as matrix
from controlplane.core.access_matrix import Caller, Outcome, documented_answer
from controlplane.experiments.services import create_experiment
from controlplane.inventory.models import Cluster, EnvConfig, Robot
from controlplane.inventory.services import import_cluster_yaml
from controlplane.realtime.routing import websocket_application
from controlplane.runs.models import Run, RunState
from controlplane.runs.state import transition
from controlplane.runs.tokens import make_run_token
from controlplane.sweeps.models import Sweep

CONFIG = (settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()
TWO_NODES = (settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # DELETE last: it may remove the sample
USERS = {Caller.VIEWER: "viewer", Caller.OPERATOR: "operator", Caller.ADMIN: "admin"}

pytestmark = pytest.mark.django_db

HTTP_DOORS = [r for r in matrix.http_routes() if r.name and not matrix.in_admin_site(r)]
SOCKET_DOORS = matrix.socket_routes()
# /healthz checks the database from another thread, closing connections as it goes,
# which a test inside one transaction does not survive.
OWN_THREAD_DB = {"healthz"}


def test_every_url_and_socket_route_has_a_rule():
    assert matrix.doors_without_rules() == []
    assert matrix.rules_without_doors() == []


def test_the_documented_matrix_is_the_table():
    doc = (settings.BASE_DIR / "docs" / "permissions.md").read_text()
    assert matrix.with_matrix(doc) == doc, "run ./manage.py access_matrix --write"


def unruled_view(request):
    return HttpResponse("nobody wrote my rule")


# The project's URLs plus one that nobody wrote a rule for.
urlpatterns = [
    path("brand-new/", guarded(unruled_view), name="brand-new"),
    path("", include("controlplane.urls")),
]


@pytest.mark.urls(__name__)
def test_a_view_without_a_rule_is_caught_and_closed(admin_client):
    assert matrix.doors_without_rules() == ["brand-new"]
    response = admin_client.get("/brand-new/")
    assert response.status_code == 403
    assert "No access rule covers" in response.content.decode()


class Sample:
    """One of everything a URL can name, and a logged-in client per role."""

    def __init__(self):
        users = {}
        for caller, name in USERS.items():
            user = get_user_model().objects.create_user(name, is_superuser=name == "admin",
                                                        is_staff=name == "admin")  # fmt: skip
            if caller is Caller.OPERATOR:
                user.groups.add(Group.objects.get_or_create(name="operator")[0])
            users[caller] = user
        self.users = users
        self.tokens = {caller: create_token(user, "t")[0].pk for caller, user in users.items()}
        experiment = create_experiment("sample", CONFIG)
        import_cluster_yaml("sample", TWO_NODES)
        self.robot = Robot.objects.first()
        self.run, self.other = (
            Run.objects.create(
                experiment=experiment, revision=experiment.latest_revision, config_yaml=CONFIG
            )
            for _ in range(2)
        )
        transition(self.run.pk, RunState.SUBMITTING)
        # A sweep row alone (no study in Optuna's tables): its doors read and change it.
        self.sweep = Sweep.objects.create(
            experiment=experiment, revision=experiment.latest_revision, spec_yaml="",
            spec={"space": {"actor.learning_rate": {"uniform": [1e-3, 2e-3]}},
                  "objective": {"metric": "rollout/success_rate"}, "budget": {"trials": 1}},
            study_name="sample",
        )  # fmt: skip

    def client(self, caller: Caller, **headers) -> Client:
        if caller is Caller.RUN_TOKEN:
            headers["HTTP_AUTHORIZATION"] = f"Bearer {make_run_token(self.run.pk)}"
        elif caller is Caller.FOREIGN_RUN_TOKEN:
            headers["HTTP_AUTHORIZATION"] = f"Bearer {make_run_token(self.other.pk)}"
        client = Client(**headers)
        if caller in self.users:
            client.force_login(self.users[caller])
        return client

    def _pk(self, name: str) -> int:
        if name.startswith("api-robot"):
            return self.robot.pk
        return self.sweep.pk if name.startswith("api-sweep") else self.run.pk

    def url(self, route: matrix.Route, caller: Caller) -> str:
        values = {
            "run_id": self.run.pk,
            "other_id": self.other.pk,
            "sweep_id": self.sweep.pk,
            "pk": self._pk(route.name),
            "name": "sample",
            "path": "metrics.jsonl",
            "token_id": self.tokens.get(caller, self.tokens[Caller.VIEWER]),
        }
        if route in SOCKET_DOORS:
            return route.url(**values)
        return reverse(route.name, kwargs={key: values[key] for key in route.kwargs})


@pytest.fixture
def sample(settings) -> Sample:
    settings.RAY_ADDRESS = "http://127.0.0.1:9"  # nothing listens: no Ray is contacted
    return Sample()


def outcome_of(response: HttpResponse) -> str:
    location = response.get("Location", "")
    if response.status_code == 302 and location.startswith("/login/?next="):
        return Outcome.LOGIN
    if response.status_code == 302 and location.startswith("/admin/login/?next="):
        return Outcome.ADMIN_LOGIN
    if response.status_code in (401, 403, 405):
        return str(response.status_code)
    return Outcome.ALLOWED


def expected(door: str, method: str, caller: Caller) -> str:
    row = DOORS[door]
    rule = row.rule(method)
    if rule is None:
        # Only DRF looks at credentials before the method: a bad Bearer token is a 401.
        bad_bearer = caller in (Caller.RUN_TOKEN, Caller.FOREIGN_RUN_TOKEN)
        return "401" if row.kind is Kind.API and bad_bearer else "405"
    answer = documented_answer(row.kind, rule, caller)
    return "403" if answer is Outcome.BAD_SIGNATURE else answer  # no signature is sent


@pytest.mark.parametrize(
    "route",
    [
        pytest.param(r, id=r.name, marks=[pytest.mark.django_db(transaction=True)])
        if r.name in OWN_THREAD_DB
        else pytest.param(r, id=r.name)
        for r in HTTP_DOORS
    ],
)
def test_each_url_answers_each_caller_as_documented(sample, route):
    wrong = []
    clients = {caller: sample.client(caller) for caller in Caller}
    for method in METHODS:
        for caller in Caller:
            client, url = clients[caller], sample.url(route, caller)
            body = {"data": "{}", "content_type": "application/json"} if method != "GET" else {}
            response = getattr(client, method.lower())(url, **body)
            got, want = outcome_of(response), expected(route.name, method, caller)
            if got != want:
                wrong.append(f"{method} {url} as {caller.value}: {response.status_code} {got}"
                             f" (documented: {want})")  # fmt: skip
    assert wrong == []


PROCESS_SETTINGS = (
    "cluster:\n  num_nodes: 1\n  node_groups:\n    - label: cpu\n      node_ranks: 0\n"
    "      env_configs:\n        - node_ranks: 0\n          env_vars:\n"
    "            - BROWSER: x\n"
)


def test_process_level_settings_answer_each_caller_as_documented(sample):
    """The `config-process-settings` part, behind the door that saves an experiment:
    the door's answer for those it refuses, then the part's (refused: 400 naming the
    key; allowed: saved)."""
    part = DOORS["config-process-settings"]
    wrong = []
    for caller in Caller:
        body = {"name": f"env-{caller.name.lower()}", "config_yaml": CONFIG + PROCESS_SETTINGS}
        response = sample.client(caller).post(
            "/api/v1/experiments", body, content_type="application/json"
        )
        want = expected("api-experiment-list", "POST", caller)
        if want == Outcome.ALLOWED:
            want = documented_answer(Kind.PART, part.rule(SEE), caller)
            got = {201: Outcome.ALLOWED, 400: Outcome.LEFT_OUT}.get(response.status_code)
            if got is Outcome.LEFT_OUT:
                paths = [error["path"] for error in response.json()["errors"]]
                got = got if paths == ["cluster.node_groups[0].env_configs[0].env_vars"] else paths
        else:
            got = outcome_of(response)
        if got != want:
            wrong.append(f"{caller.value}: {response.status_code} {got} (documented: {want})")
    assert wrong == []


def test_the_admin_site_is_for_staff_only(client, admin_client):
    group_admin = get_user_model().objects.create_user("root-ish")  # admin role, not staff
    group_admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    as_group_admin = Client()
    as_group_admin.force_login(group_admin)
    for path_ in ("/admin/", "/admin/inventory/cluster/", "/admin/auth/user/"):
        assert admin_client.get(path_).status_code == 200
        for other in (client, as_group_admin):
            response = other.get(path_)
            assert response.status_code == 302
            assert response["Location"].startswith("/admin/login/?next=")


def admin_site_urls() -> list[str]:
    """The admin site's index, and for every model registered with it its app's index,
    its list, its add page and the change page of a stored row (where one is stored)."""
    urls = {reverse("admin:index")}
    for model in admin.site._registry:
        meta = model._meta
        urls.add(reverse("admin:app_list", kwargs={"app_label": meta.app_label}))
        for page in ("changelist", "add"):
            urls.add(reverse(f"admin:{meta.app_label}_{meta.model_name}_{page}"))
        stored = model._default_manager.first()
        if stored is not None:
            urls.add(reverse(f"admin:{meta.app_label}_{meta.model_name}_change", args=[stored.pk]))
    return sorted(urls)


def test_the_admin_site_answers_each_caller_as_documented(sample):
    """Every page of the admin site, with every caller; the viewer and the operator are
    staff here, with every model permission: the role decides, not Django's flags."""
    for caller in (Caller.VIEWER, Caller.OPERATOR):
        user = sample.users[caller]
        user.is_staff = True
        user.save()
        user.user_permissions.set(Permission.objects.all())
    urls = admin_site_urls()
    for model in (Cluster, EnvConfig, Robot, get_user_model(), Group, ApiToken):
        meta = model._meta
        assert f"/admin/{meta.app_label}/{meta.model_name}/1/change/" in [
            re.sub(r"/\d+/change/", "/1/change/", url) for url in urls
        ], f"no stored {meta.label} to try its change page"
    rule = ADMIN_SITE.rule("GET")
    wrong = []
    for caller in Caller:
        client = sample.client(caller)
        want = documented_answer(ADMIN_SITE.kind, rule, caller)
        for url in urls:
            response = client.get(url)
            got = outcome_of(response)
            if got == "403" and want == Outcome.ALLOWED and url.endswith("/add/"):
                got = Outcome.ALLOWED  # let in; that model's admin adds rows for nobody
            if got != want or (want == Outcome.ALLOWED and response.status_code not in (200, 403)):
                wrong.append(f"GET {url} as {caller.value}: {response.status_code} {got}"
                             f" (documented: {want})")  # fmt: skip
    assert wrong == []


def socket_outcome(accepted: bool, code: int | None) -> str:
    if accepted:
        return Outcome.ALLOWED
    return {4401: Outcome.CLOSE_UNAUTHENTICATED, 4403: Outcome.CLOSE_FORBIDDEN}.get(code, code)


@pytest.fixture
def socket_sample(settings) -> tuple[Sample, dict[Caller, list]]:
    settings.RAY_ADDRESS = "http://127.0.0.1:9"
    sample = Sample()
    headers = {}
    for caller in Caller:
        client = sample.client(caller)
        caller_headers = [(b"origin", b"http://localhost")]
        if "sessionid" in client.cookies:
            caller_headers.append((b"cookie", f"sessionid={client.cookies['sessionid'].value}"
                                   .encode()))  # fmt: skip
        if caller is Caller.RUN_TOKEN:
            caller_headers.append((b"authorization", f"Bearer {make_run_token(sample.run.pk)}"
                                   .encode()))  # fmt: skip
        if caller is Caller.FOREIGN_RUN_TOKEN:
            caller_headers.append((b"authorization", f"Bearer {make_run_token(sample.other.pk)}"
                                   .encode()))  # fmt: skip
        headers[caller] = caller_headers
    return sample, headers


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("route", SOCKET_DOORS, ids=[r.name for r in SOCKET_DOORS])
async def test_each_socket_answers_each_caller_as_documented(socket_sample, route):
    sample, headers = socket_sample
    wrong = []
    for caller in Caller:
        url = await database_sync_to_async(sample.url)(route, caller)
        socket = WebsocketCommunicator(websocket_application, url, headers=headers[caller])
        accepted, code = await socket.connect(timeout=10)
        if accepted:
            await socket.disconnect()
        got = socket_outcome(accepted, code)
        want = documented_answer(Kind.SOCKET, DOORS[route.name].rule("CONNECT"), caller)
        if got != want:
            wrong.append(f"{url} as {caller.value}: {got} (documented: {want})")
    assert wrong == []
