"""Schemathesis against the live OpenAPI schema at /api/v1/schema/: a few generated
requests per operation, valid and invalid ones, as an admin token; no operation may
answer 5xx.

Driven through Hypothesis directly: schemathesis' lazy pytest loader (`from_fixture`,
needed because the token lives in the test database) does not work with pytest 9.
"""

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Group
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode

from controlplane.api.tokens import create_token
from tests.hostile_yaml import ALIAS_BOMB, DEEP_NESTING

pytestmark = pytest.mark.django_db

TWO_NODES = (django_settings.BASE_DIR / "examples/clusters/two_nodes.yaml").read_text()
CONFIG = (django_settings.BASE_DIR / "examples/builtin_ppo.yaml").read_text()

# Bounded and reproducible: few examples per operation and mode, derandomized (a fixed
# seed), no shrinking (the first failing request is reported as it was).
BOUNDED = settings(
    max_examples=5,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture
def api_token() -> str:
    admin = get_user_model().objects.create_user("schema-admin")
    admin.groups.add(Group.objects.get_or_create(name="admin")[0])
    return create_token(admin, "schemathesis")[1]


@pytest.fixture
def wsgi_app():
    # As Django's own test client does: a request must not close the test's database
    # connection, whose open transaction holds the test's data.
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield get_wsgi_application()
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


def server_errors(
    operation, mode: GenerationMode, headers: dict[str, str], calls: list[str]
) -> list[str]:
    """The first request of `mode` that `operation` answered with 5xx, if any."""

    @BOUNDED
    @given(case=operation.as_strategy(generation_mode=mode))
    def no_server_error(case: schemathesis.Case) -> None:
        response = case.call(headers=headers)
        calls.append(f"{case.method} {case.path} {response.status_code}")
        assert response.status_code < 500, (
            f"{case.method} {case.formatted_path} ({mode.value}) → {response.status_code}\n"
            f"{case.as_curl_command()}\n{response.text[:1500]}"
        )

    try:
        no_server_error()
    except AssertionError as error:
        return [str(error)]
    return []


def test_no_operation_answers_a_server_error(api_token: str, wsgi_app):
    headers = {"Authorization": f"Bearer {api_token}"}
    schema = schemathesis.openapi.from_wsgi(
        "/api/v1/schema/?format=json", wsgi_app, headers=headers
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    calls: list[str] = []
    problems = [
        problem
        for operation in operations
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
        for problem in server_errors(operation, mode, headers, calls)
    ]
    assert not problems, "\n\n".join(problems)
    # Every operation was really called (a skipped operation would pass silently).
    called = {call.rsplit(" ", 1)[0] for call in calls}
    assert {f"{op.method.upper()} {op.path}" for op in operations} <= called


# ---- hostile YAML in every field of the schema that carries YAML ---------------------

HOSTILE_YAML = {
    "alias bomb": (ALIAS_BOMB, "expands to more than 100000 nodes"),
    "deep nesting": (DEEP_NESTING, "nests deeper than 64 levels"),
    "huge integer": ("a: 1" + "0" * 5000 + "\n", "Exceeds the limit (4300 digits)"),
    "NUL escape": ('a: "x\\0"\n', "a NUL character"),
}
# Values for the other properties a body needs to reach its YAML: the objects the test
# stores, and a fresh name for what is created.
FILLERS = {"name": "hostile", "cluster": "lab", "experiment": "reach"}


def yaml_fields(schema: dict, body_schema: dict) -> list[str]:
    """Properties of a request body that carry YAML text, by name or description."""
    if "$ref" in body_schema:
        body_schema = schema["components"]["schemas"][body_schema["$ref"].rsplit("/", 1)[1]]
    return [
        name
        for name, spec in body_schema.get("properties", {}).items()
        if "yaml" in name.lower() or "YAML" in spec.get("description", "")
    ]


def hostile_body(operation, field: str, text: str) -> dict:
    definition = operation.definition.raw["requestBody"]["content"]["application/json"]
    body_schema = definition["schema"]
    if "$ref" in body_schema:
        body_schema = operation.schema.raw_schema["components"]["schemas"][
            body_schema["$ref"].rsplit("/", 1)[1]
        ]
    properties = body_schema.get("properties", {})
    body = {name: FILLERS[name] for name in body_schema.get("required", []) if name != field}
    # A body that names its cluster in another way (a stored one or the YAML text).
    if "cluster" in properties and field != "cluster_yaml" and "cluster_yaml" in properties:
        body["cluster"] = FILLERS["cluster"]
    body[field] = text
    return body


def test_every_yaml_field_refuses_hostile_yaml_with_a_400(api_token: str, wsgi_app):
    from controlplane.experiments.services import create_experiment
    from controlplane.inventory.services import import_cluster_yaml

    import_cluster_yaml("lab", TWO_NODES)
    create_experiment("reach", CONFIG)
    headers = {"Authorization": f"Bearer {api_token}"}
    schema = schemathesis.openapi.from_wsgi(
        "/api/v1/schema/?format=json", wsgi_app, headers=headers
    )
    checked, problems = [], []
    for result in schema.get_all_operations():
        operation = result.ok()
        request_body = operation.definition.raw.get("requestBody")
        if not request_body:
            continue
        body_schema = request_body["content"]["application/json"]["schema"]
        params = {"name": "lab" if "/clusters/" in operation.path else "reach"}
        for field in yaml_fields(schema.raw_schema, body_schema):
            for label, (text, says) in HOSTILE_YAML.items():
                case = operation.Case(
                    body=hostile_body(operation, field, text),
                    path_parameters=params if "{name}" in operation.path else {},
                    media_type="application/json",
                )
                response = case.call(headers=headers)
                checked.append(f"{operation.method.upper()} {operation.path} {field}")
                if response.status_code != 400 or says not in response.text:
                    problems.append(
                        f"{case.method} {case.formatted_path} {field} ({label}) → "
                        f"{response.status_code}: {response.text[:300]}"
                    )
    assert not problems, "\n".join(problems)
    # The walk found every YAML door of the API (a schema change must not hide one).
    assert set(checked) >= {
        "POST /api/v1/clusters yaml",
        "PUT /api/v1/clusters/{name} yaml",
        "POST /api/v1/experiments config_yaml",
        "POST /api/v1/experiments/{name}/revisions config_yaml",
        "POST /api/v1/placement/preview cluster_yaml",
        "POST /api/v1/placement/preview placement",
    }
